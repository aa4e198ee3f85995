"""A schedule's cadence in words (``daily at 02:00 Europe/Berlin``, ``every 5 minutes``),
and a time to come as the operator reads it: what the schedules page shows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

#: crontab's day of week numbers (0 is Sunday, 7 too)
DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def _every(seconds: float) -> str:
    for size, unit in UNITS:
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    return f"every {seconds:g} seconds"


def _days(field: str) -> str | None:
    parts = field.split(",")
    if not all(p.isdigit() and int(p) <= 7 for p in parts):
        return None
    return ", ".join(DAYS[int(p)] for p in parts)


def words(schedule: Any) -> str:
    """``schedule`` (a ``Cron`` or an ``Every`` of ``conventions.schedules.cadence``) in
    words; a crontab no phrase fits is shown as its fields."""
    zone = str(getattr(schedule, "tz_name", "UTC"))
    period = getattr(schedule, "period", None)
    if isinstance(period, int | float):
        return _every(float(period))
    fields = getattr(schedule, "_fields", None)
    if not callable(fields):
        return repr(schedule)
    minute, hour, day_of_week, day_of_month, month = fields()
    if minute.isdigit() and hour.isdigit() and month == "*":
        at = f"{int(hour):02d}:{int(minute):02d} {zone}"
        if day_of_week == "*" and day_of_month == "*":
            return f"daily at {at}"
        days = _days(day_of_week)
        if days and day_of_month == "*":
            return f"every {days} at {at}"
        if day_of_month.isdigit() and day_of_week == "*":
            return f"monthly on day {day_of_month} at {at}"
    if minute.isdigit() and hour == "*" and day_of_week == day_of_month == month == "*":
        return f"hourly at minute {int(minute)}"
    rest = (hour, day_of_week, day_of_month, month)
    if minute.startswith("*/") and minute[2:].isdigit() and rest == ("*",) * 4:
        return _every(int(minute[2:]) * 60.0)
    if minute == hour == day_of_week == day_of_month == month == "*":
        return "every minute"
    return f"cron {minute} {hour} {day_of_month} {month} {day_of_week} ({zone})"


def until(moment: datetime, now: datetime) -> str:
    """How long until ``moment``: ``in 3 h 05 min``, ``in 40 s``; ``now`` when past."""
    seconds = int((moment - now).total_seconds())
    if seconds <= 0:
        return "now"
    if seconds < 60:
        return f"in {seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"in {minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"in {hours} h {minutes:02d} min"
    return f"in {hours // 24} days"
