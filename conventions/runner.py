"""The worker side of a convention task: validate, claim, run, decide.

Kept apart from ``task`` so that the publish path stays small and the run path reads
top to bottom. Every outcome is one of: succeeded, skipped (already done, or SkipJob),
deferred (the key is held by a live run), retried (with a computed countdown),
dead-lettered (written to the store *before* the message is acked or rejected).
"""

from __future__ import annotations

import logging
import random
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry

from conventions import audit, context, deadletter
from conventions.context import Trace
from conventions.decisions import DeadLetter, Decision, Skip
from conventions.decisions import Retry as RetryDecision
from conventions.errors import PayloadError
from conventions.job import JobContext, keeper
from conventions.payloads import Payload
from conventions.records import Category, ClaimStatus, utcnow

if TYPE_CHECKING:
    from conventions.task import ConventionTask

logger = logging.getLogger("conventions.runner")

#: an option our own publishes carry so that the app's send_task does not check twice
READY = "_cc_ready"


def run(task: ConventionTask, request: Any, trace: Trace, args: Any, kwargs: Any) -> Any:
    """Run one delivery of ``task`` (called by ``ConventionTask.__call__``)."""
    headers = deadletter.our_headers(request)
    headers[context.CORRELATION] = trace.correlation_id
    kwargs = dict(kwargs or {})
    try:
        if args:
            raise PayloadError(
                "positional arguments are refused",
                errors=[{"loc": [], "msg": "positional arguments are refused", "type": "args"}],
                task=task.name,
            )
        payload: Payload = task.payload.parse(kwargs, task=task.name)
    except PayloadError as exc:
        shown = kwargs if not args else {"args": list(args), **kwargs}
        _dead_letter(task, request, headers, shown, None, exc, Category.INVALID, str(exc))
        raise Reject(str(exc), requeue=False) from exc

    body = task.upcast_into if task.upcast_into is not None else task
    if task.upcast is not None:
        payload = task.upcast(payload)
    key = str(headers.get(context.IDEMPOTENCY_KEY) or body.key_for(payload))
    headers[context.IDEMPOTENCY_KEY] = key
    store, settings = task.store, task.settings
    owner = uuid.uuid4().hex
    attempt = int(request.retries or 0) + 1
    claim = store.claim(key, owner, settings.lease, f"{request.id}:{request.retries or 0}")
    if claim.status is ClaimStatus.DONE:
        store.unreserve(key, request.id)
        audit.record(store, "skipped_duplicate", task.name, request.id, headers, attempt,
                     {"outcome": claim.outcome, "holder": claim.holder})
        logger.info("%s[%s]: key %s already done, body skipped", task.name, request.id, key)
        return None
    if claim.status is ClaimStatus.HELD:
        _defer(task, request, headers, kwargs, attempt, key)
    if claim.deliveries > settings.max_deliveries:
        reason = (f"claimed {claim.deliveries} times for attempt {attempt} without finishing: "
                  "the job keeps killing its worker")
        store.release(key, owner, None)
        _dead_letter(task, request, headers, kwargs, key, None, Category.POISON, reason)
        audit.record(store, "quarantined", task.name, request.id, headers, attempt,
                     {"deliveries": claim.deliveries})
        raise Reject(reason, requeue=False)

    ctx = JobContext(
        task=task.name,
        task_id=request.id,
        idempotency_key=key,
        attempt=attempt,
        trace=trace,
        reconcile_first=bool(headers.get(context.RECONCILE)),
        replay_of=headers.get(context.REPLAY_OF),
    )
    keeper.hold(store, key, owner, settings.lease)
    audit.record(store, "started", task.name, request.id, headers, attempt)
    try:
        if ctx.reconcile_first and body.reconcile is not None and body.reconcile(payload, ctx):
            result: Any = None  # the provider says the effect already happened
        else:
            result = body.run(payload, ctx)
    except (Retry, Ignore, Reject):
        keeper.drop(key, owner)
        store.release(key, owner, None)
        raise
    except Exception as exc:
        keeper.drop(key, owner)
        decision = body.decisions.decide(exc)
        return _on_failure(task, body, request, headers, kwargs, key, owner, exc, decision)
    keeper.drop(key, owner)
    reserved_by = request.id if task.dedup == "until_done" else None
    store.complete(key, owner, "succeeded", settings.ledger_keep, reserved_by)
    audit.record(store, "succeeded", task.name, request.id, headers, attempt)
    return result


def _defer(
    task: ConventionTask,
    request: Any,
    headers: dict[str, Any],
    kwargs: dict[str, Any],
    attempt: int,
    key: str,
) -> NoReturn:
    """The key is held by a live run: publish this delivery again for later, spend no
    attempt, and ack this copy. It is never run twice at once and never dropped."""
    lease = task.settings.lease
    countdown = lease / 2 + random.uniform(0, lease / 2)
    task.apply_async(
        (), kwargs, task_id=request.id, headers=headers, countdown=countdown,
        retries=request.retries or 0, **{READY: True},
    )
    audit.record(task.store, "deferred", task.name, request.id, headers, attempt,
                 {"delay": round(countdown, 3), "reason": "key held by a live run"})
    logger.info("%s[%s]: key %s held by a live run, deferred %.1fs",
                task.name, request.id, key, countdown)
    raise Ignore()


def _on_failure(
    task: ConventionTask,
    body: ConventionTask,
    request: Any,
    headers: dict[str, Any],
    kwargs: dict[str, Any],
    key: str,
    owner: str,
    exc: Exception,
    decision: Decision,
) -> Any:
    store = task.store
    attempt = int(request.retries or 0) + 1
    if isinstance(decision, Skip):
        store.release(key, owner, request.id)
        audit.record(store, "skipped", task.name, request.id, headers, attempt,
                     {"reason": decision.reason})
        logger.info("%s[%s] skipped: %s", task.name, request.id, decision.reason)
        return None
    if isinstance(decision, RetryDecision):
        if attempt < body.backoff.max_attempts:
            _retry(task, body, request, headers, key, owner, exc, decision, attempt)
        decision = DeadLetter(
            Category.EXHAUSTED, f"gave up after {attempt} attempts: {exc!r}", alert=True
        )
    store.release(key, owner, None)
    _dead_letter(task, request, headers, kwargs, key, exc, decision.category, decision.reason,
                 alert=decision.alert)
    raise exc


def _retry(
    task: ConventionTask,
    body: ConventionTask,
    request: Any,
    headers: dict[str, Any],
    key: str,
    owner: str,
    exc: Exception,
    decision: RetryDecision,
    attempt: int,
) -> NoReturn:
    store, settings = task.store, task.settings
    countdown = body.backoff.countdown(attempt, decision.delay, settings.max_countdown)
    store.release(key, owner, None)  # the enqueue reservation stays: duplicates still dedup
    retry_headers = dict(headers)
    retry_headers.setdefault(context.FIRST_FAILED_AT, utcnow().isoformat())
    if decision.reconcile:
        retry_headers[context.RECONCILE] = "1"
    else:
        retry_headers.pop(context.RECONCILE, None)
    audit.record(store, "retried", task.name, request.id, headers, attempt,
                 {"delay": round(countdown, 3), "reason": decision.reason,
                  "exc_type": type(exc).__qualname__})
    logger.warning("%s[%s] attempt %d failed (%s: %s); retrying in %.2fs",
                   task.name, request.id, attempt, type(exc).__qualname__, exc, countdown)
    raise task.retry(exc=exc, countdown=countdown, headers=retry_headers, **{READY: True})


def _dead_letter(
    task: ConventionTask,
    request: Any,
    headers: dict[str, Any],
    payload: dict[str, Any],
    key: str | None,
    exc: BaseException | None,
    category: Category,
    reason: str,
    alert: bool = False,
) -> None:
    """Write the dead-letter record first, then audit and log; the caller then acks."""
    first = headers.get(context.FIRST_FAILED_AT)
    record = deadletter.build(
        task=task.name, request=request, headers=headers, category=category, payload=payload,
        idempotency_key=key, exc=exc, reason=reason,
        first_failed_at=datetime.fromisoformat(first) if first else None,
    )
    task.store.put_dead_letter(record)
    if key:
        task.store.unreserve(key, request.id)
    audit.record(task.store, "dead_lettered", task.name, request.id, headers,
                 int(request.retries or 0) + 1,
                 {"category": str(category), "dead_letter_id": record.id, "reason": record.message})
    logger.error("%s[%s] dead-lettered as %s (%s): %s", task.name, request.id, category, record.id,
        record.message, exc_info=exc if alert else None)
