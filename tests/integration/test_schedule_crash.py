"""Beat dying in the middle of a send: the occurrence is sent, and runs once.

A send has two steps, the publish and the record that the occurrence was sent. A beat
killed between them must neither suppress the occurrence nor make it run twice. The
store and the broker are real, the worker is a thread worker.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

from conventions.schedules import beat as scheduler
from conventions.schedules.entries import Occurrence
from tasks import app
from tests.acceptance import support_schedules as support
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker", "ticking")

ENTRY = support.TWO_BEATS[0]  # tick, every minute, testing.sched_tick.v1
#: the old send's first step: ``sent:<key>`` reserved for 3 days, before the publish
OLD_SENT_KEEP = 3 * 86400.0


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's app knows the entry (a beat key is honoured for its entries only)."""
    monkeypatch.setitem(app.conf, "conventions_schedule", support.TWO_BEATS)


def _events(occurrence: Occurrence) -> Counter[str]:
    return Counter(event.event for event in app.store.audit_for(occurrence.correlation_id))


def _ran(occurrence: Occurrence) -> str | None:
    state = app.store.get_state(f"test:tick:{occurrence.key}")
    return None if state is None else str(state["task_id"])


def test_a_beat_that_died_between_reserving_and_publishing_does_not_suppress_the_run() -> None:
    occurrence = ENTRY.occurrence(dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC))
    # what a beat that reserved ``sent:<key>`` and died before its publish leaves behind
    assert app.store.reserve(f"sent:{occurrence.key}", "never-published", OLD_SENT_KEEP) is None

    result = scheduler.send(app, ENTRY, occurrence)  # the next beat's tick

    assert not getattr(result, "deduplicated", False)
    assert wait_for(lambda: _ran(occurrence), timeout=20) == result.id
    events = wait_for(lambda: (found := _events(occurrence))["succeeded"] and found)
    assert (events["published"], events["succeeded"], events["deduplicated"]) == (1, 1, 0)


def test_a_beat_that_died_after_publishing_and_before_recording_the_send_runs_it_once() -> None:
    occurrence = ENTRY.occurrence(dt.datetime(2026, 11, 30, 10, 1, tzinfo=dt.UTC))
    first = scheduler.publish(app, ENTRY, occurrence)  # published, then beat is killed
    wait_for(lambda: _events(occurrence)["succeeded"])

    again = scheduler.send(app, ENTRY, occurrence)  # the restarted beat sends it again

    events = wait_for(lambda: (found := _events(occurrence))["skipped_duplicate"] and found)
    assert events["succeeded"] == 1  # the ledger absorbed the second message
    assert _ran(occurrence) == first.id
    later = scheduler.send(app, ENTRY, occurrence)  # now recorded as sent: nothing published
    assert later.deduplicated and later.id == again.id
    assert _events(occurrence)["published"] == 2


def test_two_sends_of_an_occurrence_whose_job_has_not_finished_publish_it_once() -> None:
    occurrence = ENTRY.occurrence(dt.datetime(2026, 11, 30, 10, 2, tzinfo=dt.UTC))
    first = scheduler.send(app, ENTRY, occurrence)
    second = scheduler.send(app, ENTRY, occurrence)

    assert second.deduplicated and second.id == first.id
    events = wait_for(lambda: (found := _events(occurrence))["succeeded"] and found)
    assert (events["published"], events["deduplicated"]) == (1, 1)
