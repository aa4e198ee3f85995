"""Schedule entries declared in one place, each occurrence with its own business key.

    ENTRIES = [
        Entry("daily-sales", "reports.daily_sales.v1",
              daily(at="03:00", tz="Asia/Bangkok"), payload=business_date(days=-1),
              overlap="allow", catch_up=6 * 3600, expect=succeeds_by("04:00")),
        Entry("sync-stock", "shop.sync_stock.v1", every(minutes=5), overlap="skip"),
    ]

``celeryconfig.py`` names the list (``conventions_schedule``) and sets
``beat_scheduler = "conventions.schedules.beat:Scheduler"``. Every occurrence is a point in
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
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal

from conventions.errors import ConfigurationError
from conventions.schedules.cadence import (
    Cron,
    Every,
    Schedule,
    aware,
    clock_time,
    crontab,
    daily,
    every,
    now,
    set_clock_offset,
    use_clock,
)

__all__ = [
    "Cron",
    "Entry",
    "Every",
    "Expectation",
    "Occurrence",
    "Schedule",
    "beat_schedule",
    "business_date",
    "crontab",
    "daily",
    "entries_of",
    "every",
    "find",
    "now",
    "set_clock_offset",
    "succeeds_by",
    "succeeds_within",
    "use_clock",
]

#: entry names: lower-case words and dashes, no colon (the key separator)
ENTRY_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")
#: the namespace of occurrence correlation ids (uuid5 of the occurrence key)
OCCURRENCE_NAMESPACE = uuid.UUID("6f1c3e0a-51a4-4c1e-9d6b-8f7f3c0b9a11")
Overlap = Literal["skip", "replace", "allow"]
OVERLAPS: tuple[str, ...] = ("skip", "replace", "allow")


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
    return Expectation(by=clock_time(at))


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
        at = aware(at)
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
