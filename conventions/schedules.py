"""Schedule entries declared in one place, each occurrence with its own business key.

    ENTRIES = [
        Entry("daily-sales", "reports.daily_sales.v1",
              daily(at="03:00", tz="Asia/Bangkok"), payload=business_date(days=-1),
              overlap="allow", catch_up=6 * 3600, expect=succeeds_by("04:00")),
        Entry("sync-stock", "shop.sync_stock.v1", every(minutes=5), overlap="skip"),
    ]

``celeryconfig.py`` names the list (``conventions_schedule``) and sets
``beat_scheduler = "conventions.scheduler:Scheduler"``. Every occurrence is a point in
time computed from the schedule alone (``every`` aligns to the clock, not to when beat
started), so every beat, a restart or a manual trigger name the same occurrence: its
label (``2026-11-30`` for a daily entry, ``2026-11-30T10:05`` for a frequent one, in the
entry's timezone) makes the idempotency key ``beat:<entry>:<label>`` and a correlation id
of its own. The schedule classes are Celery's ``crontab`` and ``schedule``, so Sentry
Crons (``monitor_beat_tasks``) recognise them.

The clock is injectable for tests only: ``conventions_clock_offset_seconds`` shifts
"now" for beat, the guard and the watchdog alike.
"""

from __future__ import annotations

import importlib
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from celery.schedules import crontab as celery_crontab
from celery.schedules import schedstate
from celery.schedules import schedule as celery_every

from conventions.errors import ConfigurationError

#: entry names: lower-case words and dashes, no colon (the key separator)
ENTRY_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")
#: the namespace of occurrence correlation ids (uuid5 of the occurrence key)
OCCURRENCE_NAMESPACE = uuid.UUID("6f1c3e0a-51a4-4c1e-9d6b-8f7f3c0b9a11")
#: an on-time send may be this late (seconds); ``catch_up`` widens it
LATE_TOLERANCE = 60.0
#: most occurrences one search walks (a guard against a runaway cron search)
MAX_STEPS = 20_000

Overlap = Literal["skip", "replace", "allow"]
OVERLAPS: tuple[str, ...] = ("skip", "replace", "allow")

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


def _aware(moment: datetime) -> datetime:
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
        moment = self.next_after(_aware(start))
        end = _aware(end)
        while moment <= end and len(found) < MAX_STEPS:
            found.append(moment)
            moment = self.next_after(moment)
        return found

    def due(self, last_run_at: datetime | None, until: datetime) -> list[datetime]:
        """The occurrences to send now: after the last send, within the window."""
        start = _aware(until) - timedelta(seconds=self.window())
        if last_run_at is not None:
            start = max(start, _aware(last_run_at))
        return self.between(start, until)

    def latest(self, at: datetime) -> datetime | None:
        """The last occurrence at or before ``at`` (within about a year)."""
        for days in (1 / 24, 1, 32, 400):
            found = self.between(_aware(at) - timedelta(days=days), at)
            if found:
                return found[-1]
        return None

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        current = self.now()
        return self.next_after(max(_aware(last_run_at), current)) - current

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
        local = _aware(moment).astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
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
                if found > _aware(moment):
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
        step = math.floor(_aware(moment).timestamp() / self.period) + 1
        return datetime.fromtimestamp(step * self.period, UTC)


Schedule = Cron | Every


def _clock_time(text: str) -> time:
    try:
        return time.fromisoformat(text)
    except ValueError as exc:
        raise ConfigurationError(f"a time of day looks like '03:00', got {text!r}") from exc


def daily(at: str, tz: str = "UTC") -> Cron:
    """Once a day at ``at`` (``"03:00"``) in timezone ``tz`` (``"Asia/Bangkok"``)."""
    moment = _clock_time(at)
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


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of one entry: a scheduled time and the names derived from it."""

    entry: str
    #: the scheduled time (UTC), never the send time
    at: datetime
    #: the scheduled time in the entry's timezone
    local: datetime
    #: ``2026-11-30`` or ``2026-11-30T10:05`` (the entry's timezone)
    label: str

    @property
    def date(self) -> date:
        """The business date: the occurrence's day in the entry's timezone."""
        return self.local.date()

    @property
    def key(self) -> str:
        """The idempotency key of the occurrence's job."""
        return f"beat:{self.entry}:{self.label}"

    @property
    def correlation_id(self) -> str:
        """One story per occurrence: every send, run, duplicate and alarm of it."""
        return uuid.uuid5(OCCURRENCE_NAMESPACE, self.key).hex


@dataclass(frozen=True)
class Expectation:
    """When an occurrence must have succeeded: by a time of day, or within a delay."""

    by: time | None = None
    within: float | None = None

    def deadline(self, occurrence: Occurrence) -> datetime:
        if self.within is not None:
            return occurrence.at + timedelta(seconds=self.within)
        assert self.by is not None
        local = occurrence.local
        candidate = datetime.combine(local.date(), self.by, tzinfo=local.tzinfo)
        if candidate < local:
            candidate += timedelta(days=1)
        return candidate.astimezone(UTC)

    def longest_wait(self) -> float:
        return self.within if self.within is not None else 86400.0


def succeeds_by(at: str) -> Expectation:
    """Each occurrence succeeds by ``at`` (``"04:00"``) in the entry's timezone: the same
    day when that is after the occurrence, else the next day."""
    return Expectation(by=_clock_time(at))


def succeeds_within(*, minutes: float = 0, seconds: float = 0) -> Expectation:
    """Each occurrence succeeds within this delay of its scheduled time."""
    return Expectation(within=minutes * 60 + seconds)


PayloadBuilder = Callable[[Occurrence], Mapping[str, Any]]


def business_date(field_name: str = "business_date", days: int = 0) -> PayloadBuilder:
    """A payload builder: ``{field_name: the occurrence's date + days}`` (``days=-1``: the
    day before, for a report on the finished day)."""

    def build(occurrence: Occurrence) -> dict[str, Any]:
        return {field_name: occurrence.date + timedelta(days=days)}

    return build


@dataclass(frozen=True)
class Entry:
    """One scheduled job: what runs, when, with which payload, and what to expect."""

    name: str
    task: str
    schedule: Schedule
    #: a static payload, or a function of the ``Occurrence`` (computed at send time)
    payload: Mapping[str, Any] | PayloadBuilder = field(default_factory=dict)
    #: what a run does when the previous one is still going
    overlap: Overlap = "skip"
    #: seconds: occurrences missed this recently are still sent (once each)
    catch_up: float = 0.0
    expect: Expectation | None = None
    #: ``replace``: seconds the newer run waits for the older one to stop
    replace_wait: float = 30.0

    def __post_init__(self) -> None:
        if not ENTRY_NAME.match(self.name):
            raise ConfigurationError(
                f"schedule entry name {self.name!r}: lower-case words and dashes, no colon "
                "(e.g. 'daily-sales')"
            )
        if self.overlap not in OVERLAPS:
            raise ConfigurationError(f"{self.name}: overlap must be one of {OVERLAPS}")
        if not isinstance(self.schedule, Cron | Every):
            raise ConfigurationError(
                f"{self.name}: schedule must come from daily(), every() or crontab()"
            )
        if self.catch_up < 0:
            raise ConfigurationError(f"{self.name}: catch_up must be seconds >= 0")
        object.__setattr__(self, "schedule", self.schedule.with_catch_up(self.catch_up))

    def occurrence(self, at: datetime) -> Occurrence:
        at = _aware(at)
        return Occurrence(self.name, at, at.astimezone(self.schedule.zone), self.schedule.label(at))

    def payload_for(self, occurrence: Occurrence) -> dict[str, Any]:
        """The payload of one occurrence (built at send time, from its scheduled time)."""
        if callable(self.payload):
            return dict(self.payload(occurrence))
        return dict(self.payload)


def beat_schedule(entries: Iterable[Entry], at: datetime | None = None) -> dict[str, Any]:
    """Celery's ``beat_schedule`` for ``entries``; a new entry starts one window back, so
    a beat started just after an occurrence still sends it."""
    current = at or now()
    return {
        entry.name: {
            "task": entry.task,
            "schedule": entry.schedule,
            "last_run_at": current - timedelta(seconds=entry.schedule.window()),
        }
        for entry in entries
    }


def entries_of(app: Any) -> list[Entry]:
    """The app's entries: ``conventions_schedule`` is a list, or ``"module:attribute"``
    naming one (imported when asked, after the app's tasks)."""
    value = app.conf.get("conventions_schedule") or []
    if isinstance(value, str):
        module, _, attr = value.partition(":")
        value = getattr(importlib.import_module(module), attr or "ENTRIES")
    entries = list(value)
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"schedule entry names must be unique: {sorted(names)}")
    return entries


def find(app: Any, name: str) -> Entry:
    for entry in entries_of(app):
        if entry.name == name:
            return entry
    known = sorted(entry.name for entry in entries_of(app))
    raise ConfigurationError(f"no schedule entry {name!r}; known entries: {known}")
