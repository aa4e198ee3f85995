"""``run_schedule`` beside the every-minute watchdog the schedules guide recommends: a
virtual week sends the app's own entries, not 10,080 watchdog jobs (it took 68 s, and the
first ``drain()`` hit ``DrainLimit``); the watchdog runs when named, and its check runs
virtually when the test asks."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from conventions import App, JobContext, Payload
from conventions.config import profile
from conventions.schedules import entries as schedules
from conventions.schedules import watchdog
from conventions.testing import JobKit

MONDAY = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)


class Day(Payload):
    business_date: dt.date


def _app() -> App:
    app = App("kit_schedule", set_as_current=False)
    unreachable = "redis://127.0.0.1:1"
    app.conf.update(
        profile.reliable(broker_url=f"{unreachable}/0", store_url=f"{unreachable}/1"),
        conventions_workloads={"default": "kit"},
    )

    @app.job("reports.daily.v1", payload=Day, key="daily:{business_date}", workload="default")
    def daily(payload: Day, ctx: JobContext) -> None:
        return None

    watchdog.register(app)
    app.conf.conventions_schedule = [
        schedules.Entry(
            "daily",
            "reports.daily.v1",
            schedules.daily("06:00", tz="UTC"),
            payload=schedules.business_date(days=-1),
            expect=schedules.succeeds_by("07:00"),
        ),
        watchdog.entry(),
    ]
    return app


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[JobKit]:
    with JobKit.open(_app(), store_url=f"sqlite:///{tmp_path / 's.db'}", start=MONDAY) as kit:
        yield kit


def test_a_virtual_day_of_beat_leaves_the_every_minute_watchdog_out(kit: JobKit) -> None:
    sent = kit.run_schedule(days=1)

    assert [item.entry for item in sent] == ["daily"]
    assert kit.enqueued(watchdog.TASK) == []
    assert [run.outcome for run in kit.drain()] == ["succeeded"]


def test_the_watchdog_entry_runs_when_named(kit: JobKit) -> None:
    sent = kit.run_schedule(minutes=5, entries=["watchdog"])

    assert {item.task for item in sent} == {watchdog.TASK}
    assert len(sent) == 6  # 00:00 (a new entry starts one window back) to 00:05
    assert [run.outcome for run in kit.drain(task=watchdog.TASK)] == ["succeeded"] * 6


def test_a_name_the_schedule_does_not_have_is_refused(kit: JobKit) -> None:
    with pytest.raises(ValueError, match=r"no schedule entry named \['dialy'\]"):
        kit.run_schedule(days=1, entries=["dialy"])


def test_the_watchdog_check_runs_virtually_and_alarms_a_missed_report(kit: JobKit) -> None:
    assert kit.watchdog_alarms() == []  # it starts watching

    (sent,) = kit.run_schedule(hours=7, minutes=30)  # 07:30: the 06:00 report never ran

    (alarm,) = kit.watchdog_alarms()
    assert alarm["occurrence"] == sent.label
    assert kit.enqueued(watchdog.TASK) == []
