"""Occurrences, labels, windows and expectations of schedule entries (no broker)."""

from __future__ import annotations

import datetime as dt
import pickle

import pytest
from sentry_sdk.integrations.celery.beat import _get_monitor_config

from conventions.errors import ConfigurationError
from conventions.schedules import entries as schedules
from conventions.schedules import watchdog
from conventions.schedules.entries import Entry

UTC = dt.UTC


def _at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def test_a_bangkok_daily_occurrence_is_named_by_the_bangkok_date_not_the_utc_one() -> None:
    entry = Entry(
        "daily-sales", "reports.daily_sales.v1", schedules.daily(at="06:30", tz="Asia/Bangkok"),
        payload=schedules.business_date(days=-1),
    )  # fmt: skip
    moment = entry.schedule.next_after(_at("2026-11-30T23:00:00+00:00"))
    assert moment == _at("2026-11-30T23:30:00+00:00")
    occurrence = entry.occurrence(moment)
    assert occurrence.label == "2026-12-01"
    assert occurrence.key == "beat:daily-sales:2026-12-01"
    assert entry.payload_for(occurrence) == {"business_date": dt.date(2026, 11, 30)}


def test_a_late_send_still_names_the_occurrence_it_was_due_for() -> None:
    cadence = schedules.every(minutes=1)
    due = cadence.due(_at("2026-11-30T10:04:00+00:00"), _at("2026-11-30T10:05:42+00:00"))
    assert due == [_at("2026-11-30T10:05:00+00:00")]
    entry = Entry("sync", "shop.sync.v1", cadence)
    assert entry.occurrence(due[0]).label == "2026-11-30T10:05"


def test_every_is_aligned_to_the_clock_so_two_beats_name_the_same_occurrences() -> None:
    cadence = schedules.every(minutes=5)
    assert cadence.next_after(_at("2026-11-30T10:01:13+00:00")) == _at("2026-11-30T10:05:00+00:00")
    assert cadence.next_after(_at("2026-11-30T10:03:59+00:00")) == _at("2026-11-30T10:05:00+00:00")


def test_catch_up_sends_missed_occurrences_within_its_window_only() -> None:
    cadence = schedules.every(minutes=10).with_catch_up(3600)
    last_run = _at("2026-11-30T06:00:00+00:00")  # beat was down for hours
    due = cadence.due(last_run, _at("2026-11-30T10:05:00+00:00"))
    assert due[0] == _at("2026-11-30T09:10:00+00:00") and len(due) == 6
    no_catch_up = schedules.every(minutes=10)
    assert no_catch_up.due(last_run, _at("2026-11-30T10:05:00+00:00")) == []
    assert no_catch_up.due(last_run, _at("2026-11-30T10:00:30+00:00")) == [
        _at("2026-11-30T10:00:00+00:00")
    ]


def test_a_crontab_matches_both_day_fields_in_its_timezone() -> None:
    mondays = schedules.crontab(minute="15", hour="9", day_of_week="1", tz="Europe/Paris")
    found = mondays.next_after(_at("2026-11-30T09:00:00+01:00"))  # a Monday
    assert found == _at("2026-11-30T09:15:00+01:00")
    assert mondays.next_after(found) == _at("2026-12-07T09:15:00+01:00")
    assert mondays.latest(_at("2026-12-03T00:00:00+00:00")) == found


def test_schedules_survive_beats_schedule_file_and_compare_by_value() -> None:
    for cadence in (schedules.daily(at="03:00", tz="Asia/Bangkok"), schedules.every(seconds=10)):
        assert pickle.loads(pickle.dumps(cadence)) == cadence
    assert schedules.every(minutes=1) != schedules.every(minutes=2)


def test_sentry_crons_monitor_crontab_and_minute_entries_and_skip_sub_minute_ones() -> None:
    from tasks import app

    daily = _get_monitor_config(schedules.daily(at="03:00", tz="Asia/Bangkok"), app, "d")
    assert daily == {
        "schedule": {"type": "crontab", "value": "0 3 * * *"},
        "timezone": "Asia/Bangkok",
    }
    every = _get_monitor_config(schedules.every(minutes=5), app, "e")
    assert every["schedule"] == {"type": "interval", "value": 5, "unit": "minute"}
    assert _get_monitor_config(schedules.every(seconds=10), app, "s") == {}


def test_succeeds_by_is_the_next_such_time_of_day_after_the_occurrence() -> None:
    entry = Entry(
        "night", "reports.daily_sales.v1", schedules.daily(at="23:30", tz="Asia/Bangkok"),
        expect=schedules.succeeds_by("01:00"),
    )  # fmt: skip
    occurrence = entry.occurrence(_at("2026-11-30T23:30:00+07:00"))
    assert entry.expect is not None
    assert entry.expect.deadline(occurrence) == _at("2026-12-01T01:00:00+07:00")
    within = schedules.succeeds_within(minutes=5)
    assert within.deadline(occurrence) == _at("2026-11-30T23:35:00+07:00")


def test_the_watchdog_reports_only_deadlines_passed_since_it_watches_and_not_covered() -> None:
    entry = Entry(
        "sync", "shop.sync.v1", schedules.every(minutes=10),
        expect=schedules.succeeds_within(minutes=5),
    )  # fmt: skip
    now, since = _at("2026-11-30T10:30:00+00:00"), _at("2026-11-30T09:55:00+00:00")
    missed = watchdog.missed(entry, None, now, since)
    assert [o.label for o in missed] == ["2026-11-30T10:00", "2026-11-30T10:10", "2026-11-30T10:20"]
    newer = {"occurrence": _at("2026-11-30T10:10:00+00:00").isoformat()}
    assert [o.label for o in watchdog.missed(entry, newer, now, since)] == ["2026-11-30T10:20"]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": "Daily:Sales"}, "no colon"),
        ({"overlap": "queue"}, "overlap must be one of"),
        ({"catch_up": -1}, "catch_up"),
    ],
)
def test_a_bad_entry_fails_at_declaration_saying_the_fix(
    kwargs: dict[str, object], fragment: str
) -> None:
    fields: dict[str, object] = {
        "name": "sync",
        "task": "shop.sync.v1",
        "schedule": schedules.every(minutes=1),
    }
    with pytest.raises(ConfigurationError, match=fragment):
        Entry(**{**fields, **kwargs})  # type: ignore[arg-type]
