"""Which occurrences an operator may trigger, and the refusal of the others.

An operator (the console's Trigger button, ``conventions schedule trigger``) sends the
occurrences beat itself would still send: the current one (the latest at or before now,
or the one that was current :data:`GRACE` seconds ago, so that a page served just before
the next occurrence can still be posted), or one missed within the entry's ``catch_up``
window. Anything else (an occurrence still to come, the 1999 report) is refused with its
reason, and the refusal is audited (``trigger_refused``, with the actor and what was
asked) under the entry's trail ``schedule:<entry>`` (``conventions trace schedule:NAME``).
A report of another day is a new business action: publish its task with that payload.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from conventions.observability import audit
from conventions.schedules import beat, pauses
from conventions.schedules import entries as schedules
from conventions.schedules.cadence import aware
from conventions.tracing import headers as hdr

#: how long the occurrence shown as current stays triggerable after the next one comes
GRACE = 60.0
#: the audit event of a refused trigger
REFUSED = "trigger_refused"


class NotOffered(ValueError):
    """A trigger of an occurrence an operator may not send; the message says why."""


def offered(entry: schedules.Entry, current: datetime) -> list[datetime]:
    """The occurrences an operator may trigger at ``current``, oldest first."""
    schedule = entry.schedule
    found = set(schedule.between(current - timedelta(seconds=entry.catch_up), current))
    for moment in (current, current - timedelta(seconds=GRACE)):
        latest = schedule.latest(moment)
        if latest is not None:
            found.add(latest)
    return sorted(found)


def choose(entry: schedules.Entry, at: datetime | None, current: datetime) -> datetime:
    """The occurrence at or before ``at`` (default: the current one) when it is offered;
    :class:`NotOffered` otherwise."""
    options = offered(entry, current)
    if not options:
        raise NotOffered(f"{entry.name} has no occurrence before {current.isoformat()}")
    if at is None:
        return options[-1]
    moment = aware(at)
    if moment > current:
        raise NotOffered(f"{moment.isoformat()}: that occurrence is still to come")
    if moment < options[0]:
        labels = ", ".join(entry.occurrence(o).label for o in options)
        raise NotOffered(
            f"{moment.isoformat()}: not an occurrence an operator may send: only the "
            f"current one or one missed within the entry's catch-up window "
            f"({entry.catch_up:g} s): {labels}"
        )
    return max(o for o in options if o <= moment)


def parse_at(text: str, zone: ZoneInfo) -> tuple[datetime | None, date | None]:
    """What an operator typed: an ISO datetime (UTC unless it says), or an ISO date (that
    day's last occurrence in the entry's timezone ``zone``: the end of the day, and the
    day); (None, None) for nothing. ValueError for anything else, a date at the edge of
    Python's calendar included."""
    text = text.strip()
    if not text:
        return None, None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            end = datetime.combine(day + timedelta(days=1), time(), tzinfo=zone)
            return (end - timedelta(microseconds=1)).astimezone(UTC), day
        moment = datetime.fromisoformat(text)
        return (moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)), None
    except OverflowError as exc:
        raise ValueError("outside the calendar an occurrence can have") from exc


def _of_day(day: date, end: datetime, current: datetime) -> datetime:
    """The moment to look back from for ``day``'s last occurrence: its end, or now when
    the day is today (a date names the day's occurrences that have come)."""
    start = end - timedelta(days=1)
    if start >= current:
        raise NotOffered(f"{day.isoformat()}: that day is still to come")
    return min(end, current)


def refused(app: Any, entry: schedules.Entry, asked: str, reason: str, actor: str) -> None:
    """Audit a refused trigger under the entry's trail."""
    headers = {hdr.CORRELATION: pauses.ENTRIES.correlation(entry.name), hdr.ACTOR: actor}
    detail = {"actor": actor, "schedule": entry.name, "asked": asked[:200], "reason": reason}
    audit.record(app.store, REFUSED, entry.task, uuid.uuid4().hex, headers, detail=detail)


def send(app: Any, name: str, at: str, actor: str) -> tuple[schedules.Occurrence, Any]:
    """Send the occurrence of entry ``name`` at or before ``at`` (:func:`parse_at`;
    empty: the current one), as beat would, when an operator may: the occurrence and
    the job's handle (``deduplicated`` when it was sent already). Else audit the
    refusal and raise :class:`NotOffered`. ``ConfigurationError`` for an unknown entry."""
    schedules.use_clock(app.conf)
    entry = schedules.find(app, name)
    try:
        current = schedules.now()
        try:
            asked, day = parse_at(at, entry.schedule.zone)
        except ValueError as exc:
            raise NotOffered(f"at {at[:80]!r}: {exc}") from exc
        if asked is not None and day is not None:
            asked = _of_day(day, asked, current)
        moment = choose(entry, asked, current)
        if day is not None and entry.occurrence(moment).date != day:
            raise NotOffered(f"{day.isoformat()}: no occurrence of that day is offered")
    except NotOffered as exc:
        refused(app, entry, at, str(exc), actor)
        raise
    return entry.occurrence(moment), beat.trigger(app, name, moment, actor=actor)
