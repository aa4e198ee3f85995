"""Retention against the real Redis store: what is older than the retention goes."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import signals

from conventions.config import settings
from conventions.ops import retention
from conventions.store import Store
from conventions.store.records import AuditEvent, Category, DeadLetter, utcnow
from tasks import app
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

DAY = timedelta(days=1)


def _dead_letter(last_failed_at: datetime) -> DeadLetter:
    return DeadLetter(
        id=uuid.uuid4().hex,
        task="testing.buggy.v1",
        task_id=uuid.uuid4().hex,
        category=Category.BUG,
        payload={"call_id": "r1"},
        headers={},
        idempotency_key="buggy:r1",
        exc_type="TypeError",
        message="boom",
        traceback="",
        attempts=1,
        first_failed_at=last_failed_at,
        last_failed_at=last_failed_at,
        worker="w1",
    )


def _trail(store: Store, at: datetime, events: int = 2) -> str:
    correlation_id = uuid.uuid4().hex
    for attempt in range(1, events + 1):
        store.add_audit(
            AuditEvent("started", "testing.buggy.v1", "t1", correlation_id, attempt=attempt, at=at)
        )
    return correlation_id


def test_purge_deletes_what_is_older_than_the_retention_and_keeps_the_newer() -> None:
    store, now = app.store, utcnow()
    old = _dead_letter(now - retention.DEAD_LETTER_RETENTION - DAY)
    new = _dead_letter(now - retention.DEAD_LETTER_RETENTION + DAY)
    store.put_dead_letter(old)
    store.put_dead_letter(new)
    old_trail = _trail(store, now - retention.AUDIT_RETENTION - DAY, events=3)
    new_trail = _trail(store, now - retention.AUDIT_RETENTION + DAY)

    counts = retention.purge(
        store, dead_letters=retention.DEAD_LETTER_RETENTION, audit=retention.AUDIT_RETENTION
    )

    assert counts == (1, 3)
    assert store.get_dead_letter(old.id) is None
    assert store.get_dead_letter(new.id) == new
    assert store.audit_for(old_trail) == []
    assert len(store.audit_for(new_trail)) == 2


def test_the_retention_defaults_are_30_days_14_days_and_a_purge_every_6_hours() -> None:
    conf = settings.read({})

    assert conf.retention_enabled is True
    assert conf.dead_letter_retention == timedelta(days=30).total_seconds()
    assert conf.audit_retention == timedelta(days=14).total_seconds()
    assert conf.retention_interval == timedelta(hours=6).total_seconds()
    assert settings.read({"conventions_retention_enabled": False}).retention_enabled is False
    assert settings.read({"conventions_retention_interval_seconds": -1}).retention_interval == 21600


def test_a_worker_purger_purges_at_start_and_again_after_each_interval() -> None:
    store = app.store
    first = _dead_letter(utcnow() - 2 * DAY)
    store.put_dead_letter(first)
    purger = retention.Purger(app, dead_letters=DAY, audit=DAY, interval=timedelta(seconds=0.2))
    purger.start()
    try:
        wait_for(lambda: store.get_dead_letter(first.id) is None, timeout=10)
        second = _dead_letter(utcnow() - 2 * DAY)
        store.put_dead_letter(second)
        wait_for(lambda: store.get_dead_letter(second.id) is None, timeout=10)
    finally:
        purger.stop()
    assert not purger.alive


class _BrokenApp:
    @property
    def store(self) -> Any:
        raise ConnectionError("store down")


def test_a_failing_purge_is_logged_and_the_purger_keeps_going(
    caplog: pytest.LogCaptureFixture,
) -> None:
    purger = retention.Purger(
        _BrokenApp(),
        dead_letters=DAY,
        audit=DAY,
        interval=timedelta(seconds=0.05),
    )
    with caplog.at_level(logging.ERROR, logger="conventions.ops.retention"):
        purger.start()
        wait_for(lambda: len(caplog.records) >= 2, timeout=10)
        assert purger.alive
        purger.stop()
    assert "retention: purge failed" in caplog.records[0].getMessage()
    assert not purger.alive


class _Worker:
    """What the worker signals send: an object with the app."""

    app = app


def test_worker_ready_starts_the_purger_and_worker_shutdown_stops_it() -> None:
    worker = _Worker()
    old = _dead_letter(utcnow() - retention.DEAD_LETTER_RETENTION - DAY)
    app.store.put_dead_letter(old)

    signals.worker_ready.send(sender=worker)
    try:
        purger = retention._purgers[id(app)]
        assert purger.alive
        wait_for(lambda: app.store.get_dead_letter(old.id) is None, timeout=10)
    finally:
        signals.worker_shutdown.send(sender=worker)
    assert id(app) not in retention._purgers
    assert not purger.alive
