"""Which occurrences an operator may trigger (``conventions.schedules.triggers``): the
current one, or one missed within the entry's catch-up window; never one still to come,
never the 1999 report, and never a 500 for a date at the edge of the calendar."""

from __future__ import annotations

import contextlib
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from conventions.schedules import triggers
from conventions.schedules.entries import Entry, daily, every

NOW = datetime(2026, 12, 2, 10, 0, 30, tzinfo=UTC)
DAILY = Entry("report", "reports.daily.v1", daily(at="03:00"))
CAUGHT_UP = Entry("report-2d", "reports.daily.v1", daily(at="03:00"), catch_up=2 * 86400)
FREQUENT = Entry("sync", "shop.sync.v1", every(minutes=5))


def test_the_current_occurrence_is_offered_and_sent_by_default() -> None:
    today = datetime(2026, 12, 2, 3, tzinfo=UTC)
    assert triggers.offered(DAILY, NOW) == [today]
    assert triggers.choose(DAILY, None, NOW) == today
    assert triggers.choose(DAILY, today, NOW) == today
    assert triggers.choose(DAILY, NOW, NOW) == today  # the one at or before "at"


def test_a_missed_occurrence_inside_the_catch_up_window_is_offered() -> None:
    yesterday = datetime(2026, 12, 1, 3, tzinfo=UTC)
    assert triggers.choose(CAUGHT_UP, yesterday, NOW) == yesterday
    with pytest.raises(triggers.NotOffered, match="catch-up window"):
        triggers.choose(DAILY, yesterday, NOW)


@pytest.mark.parametrize(
    "at", [datetime(1999, 3, 4, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC), NOW - timedelta(days=3)]
)
def test_an_occurrence_outside_the_window_is_refused_with_its_reason(at: datetime) -> None:
    with pytest.raises(triggers.NotOffered, match="not an occurrence an operator may send"):
        triggers.choose(CAUGHT_UP, at, NOW)


def test_an_occurrence_still_to_come_is_refused() -> None:
    with pytest.raises(triggers.NotOffered, match="still to come"):
        triggers.choose(DAILY, NOW + timedelta(hours=20), NOW)


def test_the_occurrence_shown_a_moment_before_the_next_one_is_still_offered() -> None:
    """A page served at 09:59:50 posted at 10:00:10: its occurrence is still sent."""
    just_after = datetime(2026, 12, 2, 10, 0, 10, tzinfo=UTC)
    shown = datetime(2026, 12, 2, 9, 55, tzinfo=UTC)
    assert triggers.choose(FREQUENT, shown, just_after) == shown
    with pytest.raises(triggers.NotOffered):
        triggers.choose(FREQUENT, shown - timedelta(minutes=5), just_after)


@pytest.mark.parametrize(
    "text", ["0001-01-01T00:00:00+23:59", "9999-12-31", "0001-01-01", "yesterday", "\x00"]
)
def test_what_an_operator_types_is_parsed_or_refused_never_raised_otherwise(text: str) -> None:
    with contextlib.suppress(ValueError):  # the refusal; an OverflowError would fail
        triggers.parse_at(text, ZoneInfo("Asia/Bangkok"))


def test_a_date_names_that_days_occurrence() -> None:
    moment, day = triggers.parse_at("2026-12-02", ZoneInfo("UTC"))
    assert day == date(2026, 12, 2)
    assert moment == datetime(2026, 12, 2, 23, 59, 59, 999999, tzinfo=UTC)
