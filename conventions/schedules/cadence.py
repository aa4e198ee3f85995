"""When schedule entries occur: clock-aligned intervals and crontabs in a timezone.

Occurrences are points in time computed from the schedule alone, never from when beat
started, so every beat names the same ones. ``Cron`` and ``Every`` are Celery's
``crontab`` and ``schedule`` (beat runs them, Sentry Crons recognise them) with their
timing replaced: ``next_after`` and a bounded catch-up ``window``.

The clock is injectable for tests only (``conventions_clock_offset_seconds``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab as celery_crontab
from celery.schedules import schedstate
from celery.schedules import schedule as celery_every

from conventions.errors import ConfigurationError

#: an on-time send may be this late (seconds); ``catch_up`` widens it
LATE_TOLERANCE = 60.0
#: most occurrences one search walks (a guard against a runaway cron search)
MAX_STEPS = 20_000
#: the test-only clock offset (seconds), one per process
_clock = {"offset": 0.0}


def set_clock_offset(seconds: float) -> None:
    """Shift "now" by ``seconds`` (tests only: a day boundary without waiting for it)."""
    _clock["offset"] = float(seconds)


def use_clock(conf: Any) -> None:
    """Apply ``conventions_clock_offset_seconds`` of a Celery ``app.conf``."""
    set_clock_offset(float(conf.get("conventions_clock_offset_seconds") or 0.0))


def now() -> datetime:
    """The schedules' now (UTC), shifted by the test-only clock offset."""
    return datetime.now(UTC) + timedelta(seconds=_clock["offset"])


def aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class Cadence:
    """What both schedule classes add to Celery's: occurrences as points in time."""

    tz_name: str
    catch_up: float

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz_name)

    @property
    def tz(self) -> ZoneInfo:  # read by Sentry Crons for the monitor's timezone
        return self.zone

    def now(self) -> datetime:
        return now()

    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment`` (UTC)."""
        raise NotImplementedError

    def label(self, at: datetime) -> str:
        """The occurrence's name in the entry's timezone (part of its business key)."""
        raise NotImplementedError

    def shortest_period(self) -> float:
        raise NotImplementedError

    def window(self) -> float:
        """How late an occurrence may still be sent (seconds)."""
        return max(self.catch_up, min(LATE_TOLERANCE, self.shortest_period()))

    def between(self, start: datetime, end: datetime) -> list[datetime]:
        """Occurrences in ``(start, end]``."""
        found: list[datetime] = []
        moment = self.next_after(aware(start))
        end = aware(end)
        while moment <= end and len(found) < MAX_STEPS:
            found.append(moment)
            moment = self.next_after(moment)
        return found

    def due(self, last_run_at: datetime | None, until: datetime) -> list[datetime]:
        """The occurrences to send now: after the last send, within the window."""
        start = aware(until) - timedelta(seconds=self.window())
        if last_run_at is not None:
            start = max(start, aware(last_run_at))
        return self.between(start, until)

    def latest(self, at: datetime) -> datetime | None:
        """The last occurrence at or before ``at`` (within about a year)."""
        for days in (1 / 24, 1, 32, 400):
            found = self.between(aware(at) - timedelta(days=days), at)
            if found:
                return found[-1]
        return None

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        current = self.now()
        return self.next_after(max(aware(last_run_at), current)) - current

    def is_due(self, last_run_at: datetime) -> schedstate:
        """Celery's question: send now? and when to ask again (seconds)."""
        current = self.now()
        is_due = bool(self.due(last_run_at, current))
        wait = (self.next_after(current) - current).total_seconds()
        return schedstate(is_due, max(wait, 0.01))


class Cron(Cadence, celery_crontab):  # type: ignore[misc]
    """A crontab in a timezone (``daily`` is one). Day of week and day of month must both
    match, as in Celery's crontab; 0 is Sunday."""

    def __init__(  # noqa: PLR0917
        self,
        minute: str = "*",
        hour: str = "*",
        day_of_week: str = "*",
        day_of_month: str = "*",
        month_of_year: str = "*",
        tz_name: str = "UTC",
        catch_up: float = 0.0,
    ) -> None:
        super().__init__(minute, hour, day_of_week, day_of_month, month_of_year)
        ZoneInfo(tz_name)  # an unknown zone fails here, at declaration
        self.tz_name = tz_name
        self.catch_up = float(catch_up)

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (*self._fields(), self.tz_name, self.catch_up))

    def _fields(self) -> tuple[str, str, str, str, str]:
        return (
            str(self._orig_minute), str(self._orig_hour), str(self._orig_day_of_week),
            str(self._orig_day_of_month), str(self._orig_month_of_year),
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cron):
            return NotImplemented
        return bool(self.__reduce__()[1] == other.__reduce__()[1])

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Cron {' '.join(self._fields())} {self.tz_name} catch_up={self.catch_up:g}s>"

    def with_catch_up(self, seconds: float) -> Cron:
        return Cron(*self._fields(), tz_name=self.tz_name, catch_up=seconds)

    @property
    def once_a_day(self) -> bool:
        return len(self.hour) == 1 and len(self.minute) == 1

    def shortest_period(self) -> float:
        return 86400.0 if self.once_a_day else 60.0

    def label(self, at: datetime) -> str:
        local = at.astimezone(self.zone)
        return local.date().isoformat() if self.once_a_day else local.strftime("%Y-%m-%dT%H:%M")

    def next_after(self, moment: datetime) -> datetime:
        zone = self.zone
        local = aware(moment).astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
        wall = local + timedelta(minutes=1)
        for _ in range(MAX_STEPS):
            if wall.month not in self.month_of_year:
                wall = (wall.replace(day=1) + timedelta(days=32)).replace(day=1, hour=0, minute=0)
            elif wall.day not in self.day_of_month or (
                (wall.weekday() + 1) % 7 not in self.day_of_week
            ):
                wall = wall.replace(hour=0, minute=0) + timedelta(days=1)
            elif wall.hour not in self.hour:
                wall = wall.replace(minute=0) + timedelta(hours=1)
            elif wall.minute not in self.minute:
                wall += timedelta(minutes=1)
            else:
                found = wall.replace(tzinfo=zone).astimezone(UTC)
                if found > aware(moment):
                    return found
                wall += timedelta(minutes=1)  # a wall time repeated by a DST change
        raise ConfigurationError(f"{self!r} has no occurrence after {moment.isoformat()}")


class Every(Cadence, celery_every):  # type: ignore[misc]
    """Every N seconds, aligned to the clock (multiples of N since the Unix epoch), so two
    beats started at different times name the same occurrences."""

    def __init__(self, seconds: float, tz_name: str = "UTC", catch_up: float = 0.0) -> None:
        if seconds <= 0:
            raise ConfigurationError("every(...) needs a positive interval")
        super().__init__(run_every=timedelta(seconds=seconds))
        ZoneInfo(tz_name)
        self.tz_name = tz_name
        self.catch_up = float(catch_up)
        self.period = float(seconds)

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.period, self.tz_name, self.catch_up))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Every):
            return NotImplemented
        return bool(self.__reduce__()[1] == other.__reduce__()[1])

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Every {self.period:g}s {self.tz_name} catch_up={self.catch_up:g}s>"

    def with_catch_up(self, seconds: float) -> Every:
        return Every(self.period, tz_name=self.tz_name, catch_up=seconds)

    def shortest_period(self) -> float:
        return self.period

    def label(self, at: datetime) -> str:
        local = at.astimezone(self.zone)
        return local.strftime("%Y-%m-%dT%H:%M" if self.period % 60 == 0 else "%Y-%m-%dT%H:%M:%S")

    def next_after(self, moment: datetime) -> datetime:
        step = math.floor(aware(moment).timestamp() / self.period) + 1
        return datetime.fromtimestamp(step * self.period, UTC)


Schedule = Cron | Every


def clock_time(text: str) -> time:
    try:
        return time.fromisoformat(text)
    except ValueError as exc:
        raise ConfigurationError(f"a time of day looks like '03:00', got {text!r}") from exc


def daily(at: str, tz: str = "UTC") -> Cron:
    """Once a day at ``at`` (``"03:00"``) in timezone ``tz`` (``"Asia/Bangkok"``)."""
    moment = clock_time(at)
    return Cron(str(moment.minute), str(moment.hour), tz_name=tz)


def every(*, minutes: float = 0, seconds: float = 0, tz: str = "UTC") -> Every:
    """Every N minutes (or seconds), aligned to the clock; ``tz`` names the labels.
    Sentry Crons skip intervals under a minute."""
    return Every(minutes * 60 + seconds, tz_name=tz)


def crontab(  # noqa: PLR0917
    minute: str = "*",
    hour: str = "*",
    day_of_week: str = "*",
    day_of_month: str = "*",
    month_of_year: str = "*",
    tz: str = "UTC",
) -> Cron:
    """A crontab in timezone ``tz`` (Celery's field syntax)."""
    return Cron(minute, hour, day_of_week, day_of_month, month_of_year, tz_name=tz)
