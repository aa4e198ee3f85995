"""A paused schedule entry: beat sends none of its occurrences, a trigger still sends the
one it names, the watchdog raises no alarm for it, and the resume lets beat send again.
Real store and broker; the jobs run on a thread worker."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

from conventions.cli.main import main
from conventions.schedules import beat as scheduler
from conventions.schedules import entries as schedules
from conventions.schedules import pauses, watchdog
from conventions.schedules.entries import Entry, Occurrence
from tasks import app
from tests.acceptance import support_schedules as support
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

TICK = support.TWO_BEATS[0]  # tick, every minute, testing.sched_tick.v1


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(app.conf, "conventions_schedule", support.TWO_BEATS)


def _events(occurrence: Occurrence) -> Counter[str]:
    return Counter(event.event for event in app.store.audit_for(occurrence.correlation_id))


@pytest.mark.usefixtures("ticking")
def test_beat_sends_nothing_of_a_paused_entry_and_a_trigger_still_sends_its_occurrence() -> None:
    first = TICK.occurrence(dt.datetime(2026, 11, 30, 11, 0, tzinfo=dt.UTC))
    second = TICK.occurrence(dt.datetime(2026, 11, 30, 11, 1, tzinfo=dt.UTC))
    pauses.pause(app, "tick", actor="olivia@ops", reason="provider migration")

    assert scheduler.send(app, TICK, first) is None  # beat's send: nothing published
    triggered = scheduler.send(app, TICK, second, actor="olivia@ops", manual=True)
    wait_for(lambda: _events(second)["succeeded"])
    assert _events(first)["published"] == 0

    assert pauses.resume(app, "tick", actor="olivia@ops") is True
    sent = scheduler.send(app, TICK, first)  # beat sends it again
    wait_for(lambda: _events(first)["succeeded"])
    assert sent is not None and sent.id != triggered.id
    assert pauses.resume(app, "tick", actor="olivia@ops") is False  # not paused any more
    trail = [(e.event, e.detail.get("actor")) for e in app.store.audit_for("schedule:tick")]
    assert trail == [
        ("schedule_paused", "olivia@ops"),
        ("schedule_resumed", "olivia@ops"),
        ("schedule_resumed", "olivia@ops"),
    ]


#: every half hour, due within a second: its last occurrences are late (none succeeded)
LATE = Entry(
    "late-report", "testing.sched_tick.v1", schedules.every(minutes=30), payload=support.slot,
    expect=schedules.succeeds_within(seconds=1),
)  # fmt: skip


def test_the_watchdog_raises_no_alarm_for_a_paused_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(app.conf, "conventions_schedule", [LATE])
    long_ago = schedules.now() - dt.timedelta(days=2)
    app.store.put_state("schedule:watched:late-report", {"since": long_ago.isoformat()}, None)
    pauses.pause(app, "late-report", actor="olivia@ops", reason="the report is rebuilt")

    assert watchdog.check(app) == []  # its last occurrence never succeeded: paused, no alarm

    app.store.delete_state(pauses.ENTRIES.record("late-report"))  # the same entry, not paused
    alarms = watchdog.check(app)
    assert alarms and {alarm["schedule"] for alarm in alarms} == {"late-report"}
    pauses.pause(app, "late-report", actor="olivia@ops", reason="again")
    before = schedules.now()
    pauses.resume(app, "late-report", actor="olivia@ops")
    state = app.store.get_state("schedule:watched:late-report")
    assert state is not None and dt.datetime.fromisoformat(state["since"]) >= before


@pytest.mark.usefixtures("ticking")
def test_the_cli_pauses_and_resumes_an_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-A", "tasks", "schedule", "pause", "tick"]) == 2  # --reason is required
    capsys.readouterr()
    code = main(["-A", "tasks", "schedule", "pause", "tick", "--reason", "r", "--actor", "cli:ops"])
    assert code == 0 and "paused" in capsys.readouterr().out
    assert main(["-A", "tasks", "schedule", "list"]) == 0
    assert "paused_by=cli:ops" in capsys.readouterr().out
    assert main(["-A", "tasks", "schedule", "resume", "tick", "--actor", "cli:ops"]) == 0
    assert main(["-A", "tasks", "schedule", "resume", "tick"]) == 1
    assert pauses.ENTRIES.get(app.store, "tick") is None
