"""Records the store keeps: dead letters and audit events.

Plain frozen dataclasses with a JSON-ready ``to_dict`` / ``from_dict`` pair, so that
both store backends (Redis keeps JSON, SQL keeps columns plus JSON) share one shape.
That shape has a version (``formats.RECORDS``): a ``v`` field, absent at version 1 (so
nothing more is written today), checked by ``from_dict``: a record written by a newer
release raises ``NewerFormat`` rather than be misread.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, cast

from conventions.config import formats


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (the only kind the store keeps)."""
    return datetime.now(UTC)


class Category(StrEnum):
    """Why a job was dead-lettered."""

    INVALID = "invalid"  #: the payload failed validation in the worker
    PERMANENT = "permanent"  #: a permanent error: trying again cannot help
    BUG = "bug"  #: an unclassified exception: a defect to fix, reported as an alert
    EXHAUSTED = "exhausted"  #: transient failures until the attempts ran out
    POISON = "poison"  #: the job kept killing its worker and was quarantined
    UNPARSEABLE = "unparseable"  #: the message could not be read as a job (raw body kept)
    #: its key was already done with another payload: neither run nor taken for the first
    CONFLICT = "conflict"
    #: written by a newer release than the worker reads: replay once the fleet runs it
    NEWER_FORMAT = "newer_format"


class ClaimStatus(StrEnum):
    """What the execution ledger answered to a claim."""

    CLAIMED = "claimed"  #: this execution owns the key now: run the body
    DONE = "done"  #: the key already succeeded: skip the body
    HELD = "held"  #: a live execution holds the lease: defer, do not run, do not drop


#: the compare-and-set tries of ``swap_replayed_at`` when a dead-letter record keeps
#: changing under it while its ``replayed_at`` stays as seen (a new failure of its job)
SWAP_TRIES = 5


def replayed_copy(raw: str, seen: datetime | None, at: datetime | None) -> str | None:
    """A dead letter's stored JSON ``raw`` with ``replayed_at`` set to ``at``, or None when
    its ``replayed_at`` is no longer ``seen`` (the stores' compare-and-set: they write
    the copy only where the record still holds ``raw``)."""
    found = DeadLetter.from_dict(json.loads(raw))
    if found.replayed_at != seen:
        return None
    return json.dumps(dataclasses.replace(found, replayed_at=at).to_dict())


@dataclass(frozen=True)
class Claim:
    """The ledger's answer to a claim."""

    status: ClaimStatus
    #: the execution that holds the key (``HELD``) or finished it (``DONE``)
    holder: str | None = None
    #: how many times the key was claimed for this delivery id, this claim included
    deliveries: int = 0
    #: the recorded outcome when ``DONE``
    outcome: str | None = None
    #: the payload fingerprint recorded with ``DONE`` (None: recorded without one)
    fingerprint: str | None = None


class Holder(str):
    """The job id holding an enqueue reservation (what ``Store.reserve`` answers), with
    the payload fingerprint it reserved with (None: reserved without one)."""

    fingerprint: str | None

    def __new__(cls, job_id: str, fingerprint: str | None = None) -> Holder:
        holder = super().__new__(cls, job_id)
        holder.fingerprint = fingerprint or None
        return holder


#: the origin of the compact audit form's times
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _dt(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


@dataclass(frozen=True)
class DeadLetter:
    """A job that failed for good, kept with everything needed to triage and replay it."""

    id: str
    task: str
    task_id: str
    category: Category
    payload: dict[str, Any]
    headers: dict[str, Any]
    idempotency_key: str | None
    exc_type: str
    #: scrubbed and truncated exception message
    message: str
    #: scrubbed and truncated traceback (empty when there is none, e.g. ``invalid``)
    traceback: str
    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime
    worker: str
    queue: str | None = None
    correlation_id: str | None = None
    #: when the record was replayed (it is kept, marked, for the audit)
    replayed_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["category"] = str(self.category)
        for name in ("first_failed_at", "last_failed_at", "replayed_at"):
            value = data[name]
            data[name] = value.isoformat() if value is not None else None
        if formats.RECORDS != 1:
            data[formats.RECORD_FIELD] = formats.RECORDS
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeadLetter:
        formats.check_record(data, "dead letter")
        values = dict(data)
        values.pop(formats.RECORD_FIELD, None)
        values["category"] = Category(values["category"])
        values["first_failed_at"] = _dt(values["first_failed_at"])
        values["last_failed_at"] = _dt(values["last_failed_at"])
        values["replayed_at"] = _dt(values.get("replayed_at"))
        return cls(**values)


@dataclass(frozen=True)
class AuditEvent:
    """One lifecycle step of one job, findable by correlation id.

    ``event`` is one of ``published``, ``deduplicated``, ``started``, ``retried``,
    ``deferred``, ``succeeded``, ``skipped_duplicate``, ``dead_lettered``, ``replayed``,
    ``quarantined``, and from backpressure ``shed`` and ``refused``.
    """

    event: str
    task: str
    task_id: str
    correlation_id: str
    causation_id: str | None = None
    idempotency_key: str | None = None
    attempt: int = 0
    at: datetime = field(default_factory=utcnow)
    #: small JSON-ready details: a delay, a reason, a category, an actor
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def run(self) -> dict[str, Any] | None:
        """The change this event makes to its job's run record (``conventions.store.runs``),
        written by the store with the event. Not a field: never part of the trail, of
        the event's equality or of its dict form."""
        return cast("dict[str, Any] | None", self.__dict__.get("_run"))

    def with_run(self, change: dict[str, Any] | None) -> AuditEvent:
        """This event, carrying ``change`` to its run (set once, as the event is made)."""
        object.__setattr__(self, "_run", change)
        return self

    def to_dict(self) -> dict[str, Any]:
        """Built field by field: ``dataclasses.asdict`` deep-copies, and this runs on
        every ``.delay()`` and every job."""
        data: dict[str, Any] = {
            "event": self.event,
            "task": self.task,
            "task_id": self.task_id,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "idempotency_key": self.idempotency_key,
            "attempt": self.attempt,
            "at": self.at.isoformat(),
            "detail": dict(self.detail),
        }
        if formats.RECORDS != 1:
            data[formats.RECORD_FIELD] = formats.RECORDS
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditEvent:
        formats.check_record(data, "audit event")
        values = dict(data)
        values.pop(formats.RECORD_FIELD, None)
        at = _dt(values.pop("at", None))
        return cls(at=at or utcnow(), **values)

    def to_compact(self) -> dict[str, Any]:
        """The form a Redis trail keeps, about half of :meth:`to_dict`'s bytes: the trail
        is one list per correlation id, so the id is left out; names are one letter,
        fields at their default are left out, and the time is POSIX microseconds (exact).
        """
        at = self.at if self.at.tzinfo is not None else self.at.replace(tzinfo=UTC)
        data: dict[str, Any] = {
            "e": self.event,
            "t": self.task,
            "j": self.task_id,
            "at": (at - _EPOCH) // _MICROSECOND,
        }
        if self.causation_id is not None:
            data["c"] = self.causation_id
        if self.idempotency_key is not None:
            data["k"] = self.idempotency_key
        if self.attempt:
            data["n"] = self.attempt
        if self.detail:
            data["d"] = dict(self.detail)
        if formats.RECORDS != 1:
            data[formats.RECORD_FIELD] = formats.RECORDS
        return data

    @classmethod
    def from_compact(cls, data: dict[str, Any], correlation_id: str) -> AuditEvent:
        """An event of the trail of ``correlation_id``, kept by :meth:`to_compact` (or
        by :meth:`to_dict`, as trails written before the compact form were)."""
        if "event" in data:
            return cls.from_dict(data)
        formats.check_record(data, "audit event")
        return cls(
            event=data["e"],
            task=data["t"],
            task_id=data["j"],
            correlation_id=correlation_id,
            causation_id=data.get("c"),
            idempotency_key=data.get("k"),
            attempt=int(data.get("n", 0)),
            at=_EPOCH + int(data["at"]) * _MICROSECOND,
            detail=dict(data.get("d") or {}),
        )
