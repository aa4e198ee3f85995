"""Uncertain outcomes with a real worker and real Redis: the next attempt reconciles first."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from conventions import bind
from tasks import app
from tests.integration import support_reconcile as jobs

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


@pytest.fixture
def call_id() -> Iterator[str]:
    """A fresh call id; its ``cc-test:`` keys are deleted afterwards."""
    call_id = f"u-{uuid.uuid4().hex[:10]}"
    yield call_id
    with jobs.flags() as client:
        client.delete(*jobs.keys_of(call_id))


def _steps(call_id: str) -> list[str]:
    with jobs.flags() as client:
        return list(client.lrange(jobs.steps_key(call_id), 0, -1))


def _effects(call_id: str) -> int:
    with jobs.flags() as client:
        return int(client.get(jobs.effect_key(call_id)) or 0)


def _events(correlation_id: str, task_id: str) -> list[tuple[str, int]]:
    trail = app.store.audit_for(correlation_id)
    return [(e.event, e.attempt) for e in trail if e.task_id == task_id]


def test_after_an_uncertain_outcome_the_next_attempt_finds_the_effect_and_succeeds_without_the_body(
    call_id: str,
) -> None:
    with bind(correlation_id=f"corr-{call_id}") as trace:
        result = jobs.uncertain.delay(call_id=call_id)

    assert result.get(timeout=30) is None  # reconciled: the body did not run again
    assert result.state == "SUCCESS"
    assert _steps(call_id) == ["body:1", "reconcile:2:found"]
    assert _effects(call_id) == 1
    events = _events(trace.correlation_id, result.id)
    assert ("retried", 1) in events
    assert events[-1] == ("succeeded", 2)


def test_when_reconcile_finds_no_effect_the_body_runs_again_and_the_effect_happens_once(
    call_id: str,
) -> None:
    with jobs.flags() as client:
        client.set(jobs.lost_key(call_id), "1")  # the first call never reached the provider
    with bind(correlation_id=f"corr-{call_id}") as trace:
        result = jobs.uncertain.delay(call_id=call_id)

    assert result.get(timeout=30) == "charged"
    assert _steps(call_id) == ["body:1", "reconcile:2:missing", "body:2"]
    assert _effects(call_id) == 1
    assert _events(trace.correlation_id, result.id)[-1] == ("succeeded", 2)
