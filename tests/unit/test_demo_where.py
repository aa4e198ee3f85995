"""Where ``make demo`` runs when the caller names the broker: the next steps it prints
name the broker and the store given (a store on Redis Cluster included)."""

from __future__ import annotations

import pytest

from demo import render, where


def test_a_given_redis_broker_and_cluster_store_are_named_in_the_next_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/5")
    monkeypatch.setenv("CONVENTIONS_STORE_URL", "redis+cluster://127.0.0.1:7000/")
    place = where.choose()
    summary = {"redis": place.redis, "trace": {"correlation_id": "c"}, "report": {"task_id": "t"}}
    steps = "\n".join(render.next_steps(summary, place.env))
    assert "REDIS_URL=redis://127.0.0.1:1/5 CONVENTIONS_STORE_URL=redis+cluster://" in steps
