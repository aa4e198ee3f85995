"""Replaying dead letters: publish the original payload again, on purpose, on the record.

A replay keeps what made the job *that* job: its payload, its idempotency key (so a side
effect that did happen is still not repeated) and its correlation id (so the trace shows
the replay beside the failure). It names the dead letter as its cause and the operator
as its actor, marks the record replayed and writes a ``replayed`` audit event saying who
replayed it and why. Where the process traces (OpenTelemetry), the replay starts a trace
of its own, linked to the run that was dead-lettered.

Refused, with a message that says what to do: an empty reason, a task declared
``replayable=False`` (it moves money, say) or a record already replayed, unless forced.
A replay whose idempotency key is still reserved by a live job is reported as
``deduplicated`` and the record is left unmarked.

Two operators (two console tabs, a CLI loop and the console) may replay one record at
once, and a job published without an enqueue reservation (``dedup=None``) has nothing
else to stop the second publish. So a replay first *claims* its record: it sets
``replayed_at`` with a compare-and-set in the store (``Store.swap_replayed_at``, from the
value it read), and only the replay that won publishes; the other is refused as already
replayed. A replay whose publish fails (the broker unreachable) or is deduplicated gives
the claim back, so the record reads as before and a later replay proceeds; a replay that
dies between its claim and its publish leaves the record marked with no ``replayed``
event in the audit trail (replay it with force).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from celery.result import AsyncResult

from conventions.observability import audit
from conventions.store.records import DeadLetter, utcnow
from conventions.task import ConventionTask
from conventions.tracing import headers as hdr
from conventions.tracing import spans

if TYPE_CHECKING:
    from conventions.app import App
    from conventions.store.base import Store

logger = logging.getLogger(__name__)


class ReplayRefused(PermissionError):
    """The replay was refused: the message says why and how to override it."""


@dataclass(frozen=True)
class ReplayOutcome:
    """What became of one dead letter in a bulk replay."""

    record_id: str
    #: the new job's handle (``result.deduplicated`` is True when nothing was published)
    result: AsyncResult[Any] | None = None
    #: why the replay was refused or failed, when it was
    error: str | None = None

    @property
    def replayed(self) -> bool:
        return self.result is not None and not getattr(self.result, "deduplicated", False)


def _task_of(app: App, record: DeadLetter) -> ConventionTask:
    task = app.tasks.get(record.task)
    if not isinstance(task, ConventionTask):
        raise LookupError(
            f"dead letter {record.id}: task {record.task!r} is not a registered convention "
            "task of this app (was it renamed or removed? point -A at the app that has it)"
        )
    return task


def replay(
    app: App, record_id: str, *, reason: str, actor: str, force: bool = False
) -> AsyncResult[Any]:
    """Publish dead letter ``record_id`` again; return the new job's handle.

    Raises ``ValueError`` for an empty reason, ``LookupError`` for an unknown record or
    task, ``ReplayRefused`` (a ``PermissionError``) when the task is not replayable or the
    record was already replayed and ``force`` is not set, and ``PayloadError`` when the
    stored payload no longer validates. When the returned result has
    ``deduplicated == True`` nothing was published and the record was left unmarked.
    """
    reason = reason.strip()
    if not reason:
        raise ValueError("a replay needs a reason (it is kept in the audit trail)")
    store = app.store
    record = store.get_dead_letter(record_id)
    if record is None:
        raise LookupError(f"no dead letter with id {record_id!r}")
    task = _task_of(app, record)
    if not task.replayable and not force:
        raise ReplayRefused(
            f"dead letter {record.id}: {record.task} is declared replayable=False (its "
            "effect must not happen twice by accident): check it did not happen, then "
            "replay with force"
        )
    if record.replayed_at is not None and not force:
        raise _already(record.id, record.replayed_at)
    claimed = utcnow()
    if not store.swap_replayed_at(record.id, record.replayed_at, claimed):
        now = store.get_dead_letter(record.id)
        if now is None:
            raise LookupError(f"no dead letter with id {record_id!r}")
        raise _already(record.id, now.replayed_at or claimed, "another replay")
    try:
        with _new_trace(record, actor):
            result = _publish(task, record, actor)
    except BaseException:
        _give_back(store, record, claimed)
        raise
    if getattr(result, "deduplicated", False):
        _give_back(store, record, claimed)
        return result
    headers = _headers(record, actor)
    if record.idempotency_key:
        headers[hdr.IDEMPOTENCY_KEY] = record.idempotency_key
    audit.record(
        store,
        "replayed",
        record.task,
        str(result.id),
        headers,
        detail={
            "actor": actor,
            "reason": reason,
            "dead_letter_id": record.id,
            "forced": force,
            "replay_of_task_id": record.task_id,
        },
        # as of the claim, before the publish: a worker may run the job before the
        # broker's confirm reaches us (a RabbitMQ cluster confirms once a majority wrote
        # it), and the trail must not say it was replayed after it succeeded
        at=claimed,
    )
    return result


def _already(record_id: str, at: datetime, by: str = "") -> ReplayRefused:
    who = f" by {by}" if by else ""
    return ReplayRefused(
        f"dead letter {record_id} was already replayed{who} at "
        f"{at.isoformat(timespec='seconds')}: replay with force to publish it once more"
    )


def _give_back(store: Store, record: DeadLetter, claimed: datetime) -> None:
    """Undo this replay's claim (best effort: a store that fails here leaves the record
    marked, and the failure is logged)."""
    try:
        store.swap_replayed_at(record.id, claimed, record.replayed_at)
    except Exception:
        logger.exception("dead letter %s: the replay's claim could not be given back", record.id)


def _headers(record: DeadLetter, actor: str) -> dict[str, str]:
    correlation = record.correlation_id or record.headers.get(hdr.CORRELATION)
    headers: dict[str, str] = {
        hdr.REPLAY_OF: record.id,
        hdr.CAUSATION: f"replay:{record.id}",
        hdr.ACTOR: actor,
    }
    if correlation:
        headers[hdr.CORRELATION] = str(correlation)
    # a beat key stays the job's key; a batch member stays in its batch
    for name in (hdr.SCHEDULE, hdr.OCCURRENCE, hdr.BATCH):
        if isinstance(record.headers.get(name), str):
            headers[name] = record.headers[name]
    return headers


def _publish(task: ConventionTask, record: DeadLetter, actor: str) -> AsyncResult[Any]:
    return task.apply_async(
        kwargs=record.payload,
        idempotency_key=record.idempotency_key,
        headers=_headers(record, actor),
    )


def _new_trace(record: DeadLetter, actor: str) -> contextlib.AbstractContextManager[Any]:
    """Where this process traces, a replay is a trace of its own (its root span
    ``replay <task>``), linked to the run that was dead-lettered (the record keeps its
    ``traceparent``) and to the operator's span, if any."""
    traces = spans.active()  # None unless this process traces: never imports OpenTelemetry
    if traces is None:
        return contextlib.nullcontext()
    attributes = {"task": record.task, "dead_letter.id": record.id, "actor": actor}
    return cast(
        "contextlib.AbstractContextManager[Any]",
        traces.new_trace(f"replay {record.task}", attributes, record.headers.get(hdr.TRACEPARENT)),
    )


def replay_many(
    app: App, *, task: str, reason: str, actor: str, force: bool = False
) -> list[ReplayOutcome]:
    """Replay every dead letter of ``task`` not replayed yet, oldest first.

    One outcome per record; a refused or failed record does not stop the others.
    Records already replayed are left alone even with ``force`` (replay those by id).
    """
    if not reason.strip():
        raise ValueError("a replay needs a reason (it is kept in the audit trail)")
    store = app.store
    limit = max(store.count_dead_letters(), 1)
    records = [r for r in store.list_dead_letters(task=task, limit=limit) if r.replayed_at is None]
    outcomes: list[ReplayOutcome] = []
    for record in reversed(records):
        try:
            result = replay(app, record.id, reason=reason, actor=actor, force=force)
        except (PermissionError, LookupError, ValueError) as exc:
            outcomes.append(ReplayOutcome(record.id, error=str(exc)))
            continue
        outcomes.append(ReplayOutcome(record.id, result=result))
    return outcomes
