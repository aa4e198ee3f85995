"""The daily sales report over a virtual week of beat, and the watchdog's alarm."""

from __future__ import annotations

import datetime as dt

import pytest
from conventions.testing import JobKit

from tasks import reports

MONDAY = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)  # midnight UTC, 01:00 in Paris


@pytest.fixture
def cc_start() -> dt.datetime:
    """The kit's virtual clock starts on a Monday at midnight (UTC)."""
    return MONDAY


def test_a_week_of_beat_sends_one_report_a_day_for_the_day_before(cc_kit: JobKit) -> None:
    sent = cc_kit.run_schedule(days=7)

    days = ["2026-11-30", *(f"2026-12-0{n}" for n in range(1, 7))]
    assert [occurrence.key for occurrence in sent] == [f"beat:daily-sales:{d}" for d in days]
    assert [occurrence.at.hour for occurrence in sent] == [5] * 7  # 06:00 in Paris
    assert not any(occurrence.deduplicated for occurrence in sent)
    cc_kit.drain()
    assert [MONDAY.date() + dt.timedelta(days=n - 1) for n in range(7)] == reports.MADE


def test_the_watchdog_alarms_when_the_report_has_not_run_by_seven(cc_kit: JobKit) -> None:
    assert cc_kit.watchdog_alarms() == []  # the watchdog starts watching

    (sent,) = cc_kit.run_schedule(hours=6)  # 07:00 in Paris; the job was never run

    (alarm,) = cc_kit.watchdog_alarms()
    assert alarm["occurrence"] == sent.label == "2026-11-30"
    assert alarm["last_event"] == "published"
    assert cc_kit.watchdog_alarms() == []  # one alarm per missed occurrence


def test_no_alarm_when_the_report_ran_in_time(cc_kit: JobKit) -> None:
    assert cc_kit.watchdog_alarms() == []

    cc_kit.run_schedule(hours=6, run_jobs=True)

    assert cc_kit.watchdog_alarms() == []
    assert [dt.date(2026, 11, 29)] == reports.MADE
