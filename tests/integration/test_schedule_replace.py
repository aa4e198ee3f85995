"""The ``replace`` overlap policy through a real (thread) worker: latest wins."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from conventions.schedules import beat as scheduler
from tasks import app
from tests.acceptance import support_schedules as support
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

T0 = dt.datetime(2026, 11, 30, 10, 0, 0, tzinfo=dt.UTC)


def _outcome(occurrence: Any) -> tuple[str, str] | None:
    for event in app.store.audit_for(occurrence.correlation_id):
        if event.event in ("succeeded", "skipped", "dead_lettered", "retried"):
            return event.event, str(event.detail.get("reason", ""))
    return None


def _body_running(occurrence: Any) -> bool:
    """The body itself runs (its ``started`` event comes before the overlap check, which
    skips a run that sees a newer occurrence already sent)."""
    return app.store.get_state(f"test:latest-body:{occurrence.label}") is not None


def test_a_newer_replace_occurrence_stops_the_running_one_and_an_older_one_never_runs() -> None:
    entry = support.REPLACE
    older, newer = entry.occurrence(T0), entry.occurrence(T0 + dt.timedelta(seconds=10))
    scheduler.send(app, entry, older)
    wait_for(lambda: _body_running(older), timeout=30)
    scheduler.send(app, entry, newer)

    assert wait_for(lambda: _outcome(older), timeout=30)[0] == "skipped"
    assert "replaced" in wait_for(lambda: _outcome(older), timeout=1)[1]
    first = wait_for(lambda: app.store.get_state(f"test:latest:{older.label}"), timeout=10)
    assert first["stopped"] is True and first["end"] - first["start"] < 6

    late = entry.occurrence(T0 - dt.timedelta(seconds=10))  # sent after a newer one
    scheduler.send(app, entry, late)
    outcome, reason = wait_for(lambda: _outcome(late), timeout=30)
    assert outcome == "skipped" and "newer occurrence" in reason
    assert app.store.get_state(f"test:latest:{late.label}") is None  # the body never ran

    second = wait_for(lambda: app.store.get_state(f"test:latest:{newer.label}"), timeout=40)
    assert second["start"] >= first["end"]  # never two at once
    assert wait_for(lambda: _outcome(newer), timeout=10)[0] == "succeeded"
