"""An App whose configuration is the profile and its workloads routes jobs by itself."""

from __future__ import annotations

import json
import uuid
from typing import Any

import redis
from kombu import Queue

from conventions import App, Id, JobContext, Payload
from conventions.config.profile import reliable
from tests.conftest import BROKER_DB, REDIS_BASE, STORE_DB


class Note(Payload):
    note_id: Id


def _app(**extra: Any) -> App:
    app = App(f"routing-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(
        reliable(broker_url=f"{REDIS_BASE}/{BROKER_DB}", store_url=f"{REDIS_BASE}/{STORE_DB}"),
        conventions_workloads={"notes": "notes-lane", "reports": "reports-lane"},
        **extra,
    )
    return app


def test_the_workloads_queues_and_routes_are_declared_when_the_app_declares_none(
    broker_redis: redis.Redis, clean_store: redis.Redis
) -> None:
    app = _app()

    @app.job("testing.note.v1", payload=Note, key="note:{note_id}", workload="notes")
    def note(payload: Note, ctx: JobContext) -> str:  # pragma: no cover (never run here)
        return payload.note_id

    assert sorted(app.amqp.queues) == ["celery", "notes-lane", "reports-lane"]
    broker_redis.delete("notes-lane")
    try:
        handle = note.delay(note_id="n_1")
        raw = broker_redis.lindex("notes-lane", 0)
        assert raw is not None, "the job did not reach its workload's queue"
        assert json.loads(raw)["headers"]["id"] == handle.id
    finally:
        broker_redis.delete("notes-lane")
        app.close()


def test_queues_and_routes_the_app_declares_are_kept() -> None:
    mine = (Queue("only-this"),)
    app = _app(task_queues=mine, task_routes=({"testing.*": {"queue": "only-this"}},))
    assert sorted(app.amqp.queues) == ["only-this"]
    assert app.conf.task_routes == ({"testing.*": {"queue": "only-this"}},)
