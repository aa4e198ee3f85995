"""The run path's ways out after a failure: retry, dead letter and quarantine.

Kept apart from ``runner`` so that the run path reads top to bottom and each stays
small. ``Exits`` is a mixin of ``runner.Delivery``: the record is written to the store
*before* the message is acked or rejected (on Redis a rejected message is deleted, so
the store is its only home), and a store that cannot take the record keeps the job
(``Delivery.store_down``: published again) rather than losing it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, NoReturn

from celery._state import get_current_task
from celery.backends.base import DisabledBackend
from celery.exceptions import Reject, Retry
from kombu.exceptions import EncodeError

from conventions.batches import callbacks as batch_callbacks
from conventions.jobs.decisions import RetryDecision
from conventions.observability import alerts
from conventions.observability import deadletters as deadletter
from conventions.store import keys
from conventions.store.batches import BatchMove
from conventions.store.records import Category, DeadLetter, utcnow
from conventions.tracing import headers as hdr
from conventions.tracing import scrubbing
from conventions.tracing.headers import READY
from conventions.worker import batch_ends, signals

if TYPE_CHECKING:
    from conventions.jobs.protocol import JobTask

logger = logging.getLogger("conventions.worker.delivery")
#: the id of the job (in this thread) whose exception is a declared dead letter's
_DECLARED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "cc_declared_dead_letter", default=None
)


class _DeclaredType(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        declared = _DECLARED.get()
        if declared is None or not isinstance(instance, BaseException):
            return False
        task = get_current_task()
        return task is not None and getattr(task.request, "id", None) == declared


class ExpectedDeadLetter(metaclass=_DeclaredType):
    """Matches (``isinstance``) the exception of a job that ended as a declared dead
    letter, while Celery still handles that job: in a task's ``throws``, Celery logs it
    as ``raised expected`` at INFO without a traceback, not ``raised unexpected`` at
    ERROR. The layer's own line, a warning with the category and the record's id, says
    what happened; the result is still FAILURE. Matched by the running job's id, not by
    the exception: Celery may swap it for a pickleable copy before it logs."""


def expected(exc: BaseException, task_id: str) -> BaseException:
    """``exc``, the outcome of job ``task_id``'s declared dead letter."""
    _DECLARED.set(task_id)
    return exc


class Exits:
    """Retry, dead letter, quarantine and the FAILURE a rejected message still owes."""

    task: JobTask
    request: Any
    headers: dict[str, Any]
    kwargs: dict[str, Any]
    key: str | None
    refused: dict[str, Any]
    #: what this delivery's dead letter says of itself (:func:`dead_letter_note`), once written
    dead_letter_note: str | None = None
    #: the delivery's outcome, as its span says it (``succeeded``, ``retry``, ``dead_letter``,
    #: ``skip``, ``defer``), and its dead letter's category and id: set as it is decided
    decision: str | None = None
    category: str | None = None
    dead_letter_id: str | None = None

    def batch_move(self, outcome: str) -> BatchMove | None:
        """This job's end in its batches (``cc_batch``) once it ran under its key, or
        None when it is in none."""
        member = batch_ends.member_of(self.headers, self.task.name, self.key) if self.key else None
        return member.move(outcome, str(self.request.id)) if member else None

    def batch_fired(self, fired: list[str] | None) -> None:
        """Publish the batch callbacks this job's end made due (a failure is left to
        the sweep: :mod:`conventions.batches.callbacks`)."""
        if fired:
            batch_callbacks.publish_due(self.task.app, fired)

    if TYPE_CHECKING:  # provided by ``runner.Delivery``

        @property
        def attempt(self) -> int: ...
        @property
        def body(self) -> JobTask: ...
        def audit(self, name: str, **detail: Any) -> None: ...
        def give_up_claim(self) -> None: ...
        def store_down(self, exc: BaseException, purpose: str = "") -> NoReturn: ...

    def quarantine(self, deliveries: int) -> NoReturn:
        """The job was claimed too often without finishing: it kills its worker (or its
        way out kept failing: a retry or completion that could not be recorded)."""
        reason = (
            f"claimed {deliveries} times for attempt {self.attempt} without finishing: "
            "the job keeps killing its worker, or its outcome could not be recorded"
        )
        self.give_up_claim()
        self.dead_letter(None, Category.POISON, reason, alert=True)
        self.audit("quarantined", deliveries=deliveries)
        rejection = self.rejection(reason)
        self.settle_result(rejection)
        raise rejection

    def refuse_unencodable(self, result: Any) -> None:
        """A return value the result backend cannot encode fails in Celery *after* the
        ledger has said ``succeeded`` (an ``EncodeError``): two truths about one run.
        Refused here, before the completion: a ``bug`` dead letter that says why, the
        claim given up (a replay after the fix runs the body), and Celery's FAILURE.
        Nothing is checked where Celery stores no result."""
        task, request = self.task, self.request
        ignored = task.ignore_result or getattr(request, "ignore_result", False)
        if result is None or ignored or isinstance(task.backend, DisabledBackend):
            return
        try:
            task.backend.encode(result)
        except Exception as exc:
            serializer = getattr(task.backend, "serializer", "json")
            reason = (
                f"its return value ({type(result).__qualname__}) cannot be stored as the "
                f"job's result: {serializer} cannot encode it ({exc}); return ids and small "
                "scalars (or lists and dicts of them), or None"
            )
            refused = EncodeError(reason)
            self.give_up_claim()
            self.dead_letter(refused, Category.BUG, reason, alert=True)
            raise refused from exc

    def rejection(self, reason: str) -> Reject:
        """The ``Reject`` that ends a dead-lettered delivery, its reason naming the record:
        Celery stores it as the FAILURE's result and sends it in ``task-failed``."""
        note = self.dead_letter_note
        return Reject(f"{reason} [{note}]" if note else reason, requeue=False)

    def settle_result(self, exc: BaseException) -> None:
        """A rejected message never reaches Celery's result handling: store FAILURE so
        that a caller waiting on ``.get()`` gets an answer instead of waiting forever."""
        task = self.task
        if task.ignore_result:
            return
        try:
            task.backend.mark_as_failure(
                self.request.id, exc, request=self.request, call_errbacks=False
            )
        except Exception:
            logger.warning("%s[%s]: could not store its failure", task.name, self.request.id,
                           exc_info=True)  # fmt: skip

    def record(self, exc: BaseException | None, category: Category, reason: str) -> DeadLetter:
        """The dead-letter record; one that cannot be built whole (a foreign value the
        readers let through and the record chokes on) is still built from what is known
        for sure plus the raw headers: the job is never lost for want of a record."""
        first = hdr.read_header(hdr.FIRST_FAILED_AT, self.headers.get(hdr.FIRST_FAILED_AT))
        try:
            return deadletter.build(
                task=self.task.name,
                request=self.request,
                headers=self.headers,
                category=category,
                payload=self.payload_kept(category),
                idempotency_key=self.key,
                exc=exc,
                reason=reason,
                first_failed_at=hdr.parse_time(first) if first else None,
                refused=self.refused,
            )
        except Exception as error:
            logger.warning("%s[%s]: its dead-letter record could not be built whole (%s)",
                           self.task.name, self.request.id, type(error).__qualname__)  # fmt: skip
            return deadletter.fallback(
                task=self.task.name, task_id=getattr(self.request, "id", None),
                category=category, payload=self.kwargs,
                raw_headers={**self.headers, **self.refused}, reason=reason, error=error,
            )  # fmt: skip

    def payload_kept(self, category: Category) -> dict[str, Any]:
        """The payload the record keeps. Kwargs the payload model refused (``invalid``)
        were never checked against the payload rules, so they may hold personal data:
        their strings are scrubbed (``deadletter.scrub_payload``), as the consumer's raw
        bodies are. A valid payload holds ids only and is kept as it is, for replay."""
        if category is Category.INVALID:
            return dict(deadletter.scrub_payload(self.kwargs))
        return self.kwargs

    def carried_reservation(self) -> str | None:
        """The key this job's producer reserved, when the worker derived none (a payload
        it refuses: a newer producer's extra field in a rolling deploy): the one the
        message carries. Taken from any producer, it can only free this job's own
        reservation: ``unreserve`` drops one only while this job id holds it."""
        carried = self.headers.get(hdr.IDEMPOTENCY_KEY)
        return keys.namespaced(self.task.name, carried) if carried else None

    def dead_letter(
        self, exc: BaseException | None, category: Category, reason: str, alert: bool = False
    ) -> None:
        """Write the record first, then audit and log (an alert also goes to Sentry); the
        caller then acks or rejects."""
        task, request = self.task, self.request
        record = self.record(exc, category, reason)
        reserved = self.key or self.carried_reservation()
        # a member ends with its record, named by the key it ran under, else by the one
        # its message carries (an invalid payload or key: ``batch_ends``)
        member = batch_ends.member_of(self.headers, self.task.name, self.key)
        move = None
        if member is not None:  # its id in its batch tree's partition: one script
            record = dataclasses.replace(record, id=member.record_id())
            move = member.failed(str(request.id), record.id)
        try:
            # a member's reservation is in its batch's partition (before its key is known too)
            with keys.batch_home(reserved, member.root if member else None):
                # the reservation first: a written record never leaves its key reserved
                if reserved:
                    task.store.unreserve(reserved, request.id)
                # a batch member's end moves with its record (no extra trip for others)
                fired = (
                    task.store.put_dead_letter(record, batch=move)
                    if move
                    else task.store.put_dead_letter(record)
                )
        except Exception as write_error:
            # no home for the record: keep the job instead (it runs again later)
            self.store_down(write_error, " for the dead letter")
        self.batch_fired(fired)
        self.dead_letter_note = dead_letter_note(str(category), record.id)
        self.decision, self.category, self.dead_letter_id = "dead_letter", str(category), record.id
        if exc is not None:  # in the traceback Celery stores, logs and sends to Flower
            add_note(exc, self.dead_letter_note)
        self.audit(
            "dead_lettered", category=str(category), dead_letter_id=record.id,
            reason=record.message,
        )  # fmt: skip
        line = (
            f"{task.name}[{request.id}] dead-lettered as {category} ({record.id}): {record.message}"
        )
        if alert:
            bare = keys.bare(task.name, self.key) if self.key else None  # as providers see it
            tags = {
                "task": task.name, "queue": record.queue, "idempotency_key": bare,
                "correlation_id": record.correlation_id, "category": str(category),
            }  # fmt: skip
            alerts.alert(line, exc=exc, tags={k: v for k, v in tags.items() if v is not None})
        else:  # a declared outcome (permanent, invalid): one line, no traceback
            alerts.mark_handled(exc)  # a decision, not an error report: no Sentry event
            logger.warning("%s", line)

    def retry(self, exc: Exception, decision: RetryDecision) -> NoReturn:
        """Publish the next attempt as Celery's ``Task.retry`` does (the same id and
        options, ``retries + 1``, then ``Retry`` so that Celery records RETRY), and only
        then say ``retried``. The claim is given up first, so that the retry finds the
        key free; the enqueue reservation stays (duplicates published meanwhile dedup).
        A retry that cannot be published leaves this message to be delivered again
        (requeued, not acked, as ``defer`` does), where Celery's own ``retry`` rejects it
        for good (``Reject(requeue=False)``: on Redis, deleted)."""
        task, request = self.task, self.request
        countdown = self.body.backoff.countdown(
            self.attempt, decision.delay, task.settings.max_countdown
        )
        headers = dict(self.headers)
        headers.setdefault(hdr.FIRST_FAILED_AT, utcnow().isoformat())
        if decision.reconcile:
            headers[hdr.RECONCILE] = "1"
        else:
            headers.pop(hdr.RECONCILE, None)
        self.give_up_claim()
        if request.is_eager:  # nothing to publish: Celery runs the retry in place
            raise task.retry(
                exc=scrubbing.scrubbed(exc), countdown=countdown, headers=headers, **{READY: True}
            )
        signature = task.signature_from_request(
            request, None, None, countdown=countdown, retries=(request.retries or 0) + 1,
            headers=headers, kwargsrepr=signals.kwargs_shown(request.kwargs or {}, headers),
            **{READY: True},
        )  # fmt: skip
        try:
            signature.apply_async()
        except Exception as publish_error:
            self.retry_refused(exc, publish_error)
        self.decision = "retry"
        self.audit(
            "retried", delay=round(countdown, 3), reason=decision.reason,
            exc_type=type(exc).__qualname__,
        )  # fmt: skip
        logger.warning(
            "%s[%s] attempt %d failed (%s: %s); retrying in %.2fs",
            task.name, request.id, self.attempt, type(exc).__qualname__, exc, countdown,
        )  # fmt: skip
        raise Retry(exc=scrubbing.scrubbed(exc), when=countdown, sig=signature)

    def retry_refused(self, exc: Exception, publish_error: Exception) -> NoReturn:
        """The broker refused the retry: ``retry_failed`` in the books, and this message
        back to the broker, unacked. Its next delivery runs the same attempt again; one
        that keeps failing this way is quarantined after ``max_deliveries``."""
        reason = f"the retry could not be published ({type(publish_error).__qualname__})"
        self.audit("retry_failed", reason=reason, exc_type=type(exc).__qualname__)
        logger.error("%s[%s] attempt %d failed (%s) and %s; requeued", self.task.name,
                     self.request.id, self.attempt, type(exc).__qualname__, reason)  # fmt: skip
        raise Reject(reason, requeue=True) from publish_error


def dead_letter_note(category: str, record_id: str) -> str:
    """The line a dead-lettered job's exception carries (a PEP 678 note): Celery prints
    notes under the traceback it stores in the result and sends in ``task-failed``, so
    Flower's task page names the record without a hook of its own."""
    return f"dead-lettered as {category} ({record_id}): conventions dlq show {record_id}"


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc`` once (a quarantined retry may pass the same one twice)."""
    if note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)
