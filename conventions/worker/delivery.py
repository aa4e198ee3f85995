"""The worker side of a convention task: validate, claim, run, decide.

Kept apart from ``task`` so that the publish path stays small and the run path reads
top to bottom. Every delivery ends as one of: succeeded, skipped (already done, or
SkipJob), deferred (the key is held by a live run), retried (with a computed countdown),
dead-lettered (written to the store *before* the message is acked or rejected).

Every store or broker call on the way out has a defined outcome when its server does
not answer: the message is kept (published again, or given back unacked) or its dead
letter is written; a claim that cannot be released runs out by itself (its lease is
no longer renewed). Nothing on an exit path turns a store error into the job's FAILURE.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry

from conventions.capacity import limits, locks
from conventions.capacity.leases import keeper
from conventions.errors import PayloadError, ResumeLater
from conventions.jobs.decisions import DeadLetterDecision, RetryDecision, SkipDecision
from conventions.jobs.payloads import Payload
from conventions.observability import audit, queues
from conventions.observability import deadletters as deadletter
from conventions.observability.progress import PROGRESS_STATE
from conventions.results import redis as results
from conventions.schedules import overlap
from conventions.store import keys
from conventions.store.batches import SUCCEEDED
from conventions.store.records import AuditEvent, Category, Claim, ClaimStatus
from conventions.tracing import headers as hdr
from conventions.tracing import logs, scrubbing, spans
from conventions.tracing.context import Trace
from conventions.tracing.headers import READY
from conventions.worker import signals
from conventions.worker.exits import Exits, expected
from conventions.worker.job_context import JobContext

if TYPE_CHECKING:
    from conventions.jobs.protocol import JobTask

logger = logging.getLogger("conventions.worker.delivery")


def run(task: JobTask, request: Any, trace: Trace, args: Any, kwargs: Any) -> Any:
    """Run one delivery of ``task`` (called by ``ConventionTask.__call__``)."""
    headers, refused = deadletter.our_headers(request)  # untrusted: each one read by type
    headers[hdr.CORRELATION] = trace.correlation_id
    delivery = Delivery(task, request, headers, dict(kwargs or {}), refused=refused)
    traces = spans.active()  # None unless this process traces: never imports OpenTelemetry
    if traces is None:
        return delivery.perform(args, trace)
    with traces.running(delivery):  # the run span, its attributes, the retry's link
        return delivery.perform(args, trace)


@dataclass
class Delivery(Exits):
    """One delivery of one job, from validation to its single outcome (its retry,
    dead-letter and quarantine exits in ``conventions.worker.exits``)."""

    task: JobTask
    request: Any
    headers: dict[str, Any]
    kwargs: dict[str, Any]
    key: str | None = None
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: when the body started (monotonic): the outcome events carry its run time
    ran_from: float | None = None
    #: the ``exclusive=`` lock this delivery holds, if any
    lock: str | None = None
    #: when this delivery started (monotonic): its time limit counts from about here
    started_at: float = field(default_factory=time.monotonic)
    #: headers of ours the message carried with a wrong type or format, raw: not used,
    #: kept for the dead-letter record only (``hdr.read_headers``)
    refused: dict[str, Any] = field(default_factory=dict)
    #: the payload's fingerprint, in the published task's form (``keys.fingerprint``)
    fingerprint: str | None = None
    #: the delivery's id in the ledger's claim counters (set by the claim)
    delivery_id: str | None = None

    @property
    def body(self) -> JobTask:
        return self.task.upcast_into if self.task.upcast_into is not None else self.task

    @property
    def attempt(self) -> int:
        return int(self.request.retries or 0) + 1

    def event(self, name: str, **detail: Any) -> AuditEvent:
        return audit.event(
            name, self.task.name, self.request.id, self.headers,
            attempt=self.attempt, detail={**detail, **self.timing()},
        )  # fmt: skip

    def audit(self, name: str, **detail: Any) -> None:
        audit.record(
            self.task.store, name, self.task.name, self.request.id, self.headers,
            attempt=self.attempt, detail={**detail, **self.timing()},
        )  # fmt: skip

    def timing(self) -> dict[str, float]:
        """``run_s`` for the events after the body started (the run-time histogram)."""
        if self.ran_from is None:
            return {}
        return {"run_s": round(time.monotonic() - self.ran_from, 4)}

    def waited(self) -> dict[str, float]:
        """``wait_s``: how long this delivery waited since it was due (the wait histogram)."""
        eta = getattr(self.request, "eta", None)
        wait = queues.waited(self.headers.get(hdr.ENQUEUED_AT), eta)
        return {} if wait is None else {"wait_s": round(wait, 4)}

    def perform(self, args: Any, trace: Trace) -> Any:
        """Validate, pass the dependency limits, then claim, run and record."""
        payload = self.validate(args)
        with limits.admitted(self):  # dependency tokens and slots, before the claim
            return self.execute(payload, trace)

    def validate(self, args: Any) -> Payload:
        """The payload model; an invalid message is dead-lettered as ``invalid``."""
        task = self.task
        try:
            if args:
                raise PayloadError(
                    "positional arguments are refused",
                    errors=[{"loc": [], "msg": "positional arguments", "type": "args"}],
                    task=task.name,
                )
            payload: Payload = task.payload.parse(self.kwargs, task=task.name)
        except PayloadError as exc:
            if args:
                self.kwargs = {"args": list(args), **self.kwargs}
            self.dead_letter(exc, Category.INVALID, str(exc))
            self.settle_result(exc)
            raise self.rejection(str(exc)) from exc
        self.fingerprint = keys.fingerprint(task.name, payload.model_dump(mode="json"))
        if task.upcast is not None:
            payload = task.upcast_payload(payload)
        try:  # the key the declaration derives, never one a header picks (task.run_key)
            self.key, key = task.run_key(payload, self.headers)
        except PayloadError as exc:  # an empty or oversized key: as an invalid payload
            self.dead_letter(exc, Category.INVALID, str(exc))
            self.settle_result(exc)
            raise self.rejection(str(exc)) from exc
        self.headers[hdr.IDEMPOTENCY_KEY] = key  # bare: the body's and the providers'
        logs.update_job(idempotency_key=key)
        return payload

    def execute(self, payload: Payload, trace: Trace) -> Any:
        """Take the job's ``exclusive=`` lock (else defer), then claim, run, record."""
        self.take_lock(payload)
        try:
            return self.claim_and_run(payload, trace)
        finally:
            if self.lock is not None:
                locks.give_back(self.task.store, self.lock, self.owner)

    def take_lock(self, payload: Payload) -> None:
        """Before the ledger claim, so that waiting for the lock spends no delivery."""
        name = locks.exclusive_name(self.body.exclusive, payload)
        if name is None:
            return
        try:
            holder = locks.take(self.task.store, name, self.owner, self.task.settings.lease)
        except Exception as exc:
            self.store_down(exc)
        if holder is not None:
            self.defer(f"exclusive lock {name} held by a live run")
        self.lock = name

    def claim_and_run(self, payload: Payload, trace: Trace) -> Any:
        """Claim the key, run the body, record the outcome."""
        task, request, key = self.task, self.request, str(self.key)
        store, settings = task.store, task.settings
        delivery_id = f"{request.id}:{request.retries or 0}"
        if self.headers.get(hdr.RESUMED):  # a resume is no crash: count it apart
            delivery_id += f":r{self.headers[hdr.RESUMED]}"
        self.delivery_id = delivery_id  # its counter goes with the completion
        # one round trip each for claim and complete, their audit events included, and
        # Celery's STARTED and SUCCESS writes with them when they can
        # (conventions.results.redis)
        try:
            claim = results.claim(
                task, key, self.owner, settings.lease, delivery_id,
                audit=self.event("started", **self.waited()),
            )  # fmt: skip
        except Exception as exc:
            self.store_down(exc)
        if claim.status is ClaimStatus.HELD and claim.holder == self.owner:
            claim = Claim(ClaimStatus.CLAIMED, self.owner)  # a retried claim: ours already
        if claim.status is ClaimStatus.DONE and keys.conflicting(
            claim.fingerprint, self.fingerprint
        ):
            self.conflict(claim)
        if claim.status is ClaimStatus.DONE:
            return self.skip_done(claim)
        if claim.status is ClaimStatus.HELD:
            self.defer("key held by a live run")
        if claim.deliveries > settings.max_deliveries:
            self.quarantine(claim.deliveries)
        ctx = JobContext(
            task=task.name,
            task_id=request.id,
            idempotency_key=str(self.headers[hdr.IDEMPOTENCY_KEY]),  # without namespace
            attempt=self.attempt,
            trace=trace,
            reconcile_first=bool(self.headers.get(hdr.RECONCILE)),
            replay_of=self.headers.get(hdr.REPLAY_OF),
            store=store,
            publish_progress=self.publish_progress,
            checkpoint_keep=settings.ledger_keep,
        )
        keeper.hold(store, key, self.owner, settings.lease)
        self.ran_from = time.monotonic()
        try:
            result = self.call_body(payload, ctx)
        except ResumeLater as exc:
            keeper.drop(key, self.owner)
            self.give_up_claim()
            self.resume_later(exc)
        except (Retry, Ignore, Reject):
            keeper.drop(key, self.owner)
            self.give_up_claim()
            raise
        except Exception as exc:
            keeper.drop(key, self.owner)
            return self.on_failure(exc)
        if result is not None:  # one that cannot be stored is a bug, not a success
            keeper.drop(key, self.owner)
            self.refuse_unencodable(result)
        self.succeeded(ctx)
        return result

    def conflict(self, claim: Claim) -> NoReturn:
        """The key is done, by a run of another payload: this one neither runs nor is
        taken for the first. Dead-lettered as ``conflict`` (which drops its reservation)."""
        reason = (
            f"idempotency key {self.key} was done by {claim.holder} with another payload "
            f"(fingerprint {claim.fingerprint}, this one {self.fingerprint})"
        )
        self.dead_letter(None, Category.CONFLICT, reason, alert=True)  # a key too coarse
        rejection = self.rejection(reason)
        self.settle_result(rejection)
        raise rejection

    def skip_done(self, claim: Claim) -> None:
        """The key is already done: drop this job's reservation, run nothing. A store
        that does not answer keeps the job (deferred) rather than the reservation."""
        task, request, key = self.task, self.request, str(self.key)
        move = self.batch_move(SUCCEEDED)
        try:
            task.store.unreserve(key, request.id)
            # a member whose key another run did: it ended (idempotent per member)
            fired = task.store.end_member(move) if move else None
        except Exception as exc:
            self.store_down(exc)
        self.batch_fired(fired)
        self.decision = "skip"
        self.audit("skipped_duplicate", outcome=claim.outcome, holder=claim.holder)
        logger.info("%s[%s]: key %s already done, body skipped", task.name, request.id, key)

    def succeeded(self, ctx: JobContext) -> None:
        """Record the key done (see ``conventions.results.redis``). The lease keeper lets the
        claim go first (a renewal would race the completion), and holds it again while
        the completion waits for a store that does not answer."""
        task, key, owner = self.task, str(self.key), self.owner
        store, settings = task.store, task.settings
        reserved_by = self.request.id if task.dedup == "until_done" else None
        keeper.drop(key, owner)
        try:
            # the checkpoint goes only once the ledger says done
            results.complete(
                task, key, owner, settings.ledger_keep, reserved_by,
                audit=self.event("succeeded"), after=ctx.finish,
                hold=lambda: keeper.hold(store, key, owner, settings.lease),
                let_go=lambda: keeper.drop(key, owner), deadline=self.deadline(),
                give_back=self.give_back, fingerprint=self.fingerprint,
                delivery_id=self.delivery_id, batch=self.batch_move(SUCCEEDED),
                on_fired=self.batch_fired,
            )  # fmt: skip
        except Exception as exc:
            self.completion_refused(exc)
        self.decision = "succeeded"

    def deadline(self) -> float:
        """Until when a completion waits for a store that does not answer: the patience,
        and a second before the job's time limit (the hard one would kill a job that
        ran fine and dead-letter it; the soft one would break into the wait)."""
        hard, soft = getattr(self.request, "timelimit", None) or (None, None)
        limit = soft or hard or self.task.soft_time_limit or self.task.time_limit
        deadline = time.monotonic() + results.COMPLETION_PATIENCE
        return deadline if not limit else min(deadline, self.started_at + float(limit) - 1.0)

    def completion_refused(self, exc: Exception) -> NoReturn:
        """The body ran, but the store did not take its completion in time: the message
        goes back to the broker, not acked. Its next delivery finds the key not done and
        runs the body again (at least once; providers get the same idempotency key)."""
        logger.error("%s[%s]: ran, but could not record %s as done (%s); requeued",
                     self.task.name, self.request.id, self.key, type(exc).__qualname__)  # fmt: skip
        raise Reject(f"completion not recorded ({type(exc).__qualname__})", requeue=True) from exc

    def give_back(self) -> None:
        """The SUCCESS write that carried the completion was refused past its deadline,
        and Celery acks the message after it: a copy is published (as ``defer`` does),
        whose delivery runs the body again once the claim has run out."""
        try:
            self.republish(self.task.settings.lease)
        except Exception as exc:
            logger.error("%s[%s]: could not publish it again (%s)", self.task.name,
                         self.request.id, exc)  # fmt: skip
            return
        logger.error("%s[%s]: ran, but could not record %s as done; published again",
                     self.task.name, self.request.id, self.key)  # fmt: skip

    def give_up_claim(self) -> None:
        """Release the ledger claim (a retry, a resume, a dead letter). When the store
        does not answer, the claim runs out by itself (nothing renews it any more) and
        the next delivery takes the key over: the exit goes on."""
        try:
            self.task.store.release(str(self.key), self.owner, None)
        except Exception as exc:
            logger.warning("%s[%s]: could not release %s (%s); its lease runs out",
                           self.task.name, self.request.id, self.key, exc)  # fmt: skip

    def store_down(self, exc: BaseException, purpose: str = "") -> NoReturn:
        """The store did not answer on the way out: keep the job (``defer``)."""
        self.defer(f"the store is unavailable{purpose} ({type(exc).__qualname__})", store_down=True)

    def publish_progress(self, document: dict[str, Any]) -> None:
        """Progress into the result backend, where Flower and ``AsyncResult`` see it."""
        self.task.update_state(task_id=self.request.id, state=PROGRESS_STATE, meta=document)

    def resume_later(self, exc: ResumeLater) -> NoReturn:
        """The body stopped at a clean point (a deploy): publish it again, no attempt
        spent; the next delivery continues from its checkpoint."""
        self.headers[hdr.RESUMED] = int(self.headers.get(hdr.RESUMED) or 0) + 1
        self.defer(f"resume later: {exc}")

    def call_body(self, payload: Payload, ctx: JobContext) -> Any:
        # a schedule entry's job runs under its overlap policy (``conventions.schedules.overlap``)
        lease = self.task.settings.lease
        return overlap.run(
            self.task.store, self.headers, ctx, lease, lambda: self._run(payload, ctx)
        )

    def _run(self, payload: Payload, ctx: JobContext) -> Any:
        body = self.body
        if ctx.reconcile_first and body.reconcile is not None and body.reconcile(payload, ctx):
            return None  # the provider says the effect already happened
        return body.run(payload, ctx)

    def defer(
        self, reason: str, *, store_down: bool = False, countdown: float | None = None
    ) -> NoReturn:
        """Publish this delivery again for later, spend no attempt, and ack this copy:
        the key is held by a live run (never run twice at once), or the store cannot be
        reached (never dropped), or a dependency limit says when to come back
        (``countdown``). If even the publish fails, the message goes back to the broker
        unacked."""
        lease = self.task.settings.lease
        if countdown is None:
            countdown = lease / 2 + random.uniform(0, lease / 2)
        try:
            self.republish(countdown)
        except Exception as exc:
            logger.error("%s[%s]: could not defer (%s); requeued", self.task.name,
                         self.request.id, exc)  # fmt: skip
            raise Reject(reason, requeue=True) from exc
        self.decision = "defer"
        if not store_down:  # an audit write would fail too
            self.audit("deferred", delay=round(countdown, 3), reason=reason)
        (logger.warning if store_down else logger.info)(
            "%s[%s]: deferred %.1fs: %s", self.task.name, self.request.id, countdown, reason
        )  # fmt: skip
        raise Ignore()

    def republish(self, countdown: float) -> None:
        """Publish this delivery again, due in ``countdown`` seconds, with no attempt spent."""
        self.task.apply_async(
            (), self.kwargs, task_id=self.request.id, headers=self.headers,
            countdown=countdown, retries=self.request.retries or 0,
            kwargsrepr=signals.kwargs_shown(self.kwargs, self.headers), **{READY: True},
        )  # fmt: skip

    def on_failure(self, exc: Exception) -> Any:
        """Turn the body's exception into its one decision."""
        decision = self.body.decisions.decide(exc)
        store, key = self.task.store, str(self.key)
        if isinstance(decision, SkipDecision):
            move = self.batch_move(SUCCEEDED)  # a skipped member ended: not a failure
            try:
                store.release(key, self.owner, self.request.id)
                fired = store.end_member(move) if move else None
            except Exception as release_error:  # the reservation would stay: keep the job
                self.store_down(release_error, " for the skip")
            self.batch_fired(fired)
            self.decision = "skip"
            self.audit("skipped", reason=decision.reason)
            logger.info("%s[%s] skipped: %s", self.task.name, self.request.id, decision.reason)
            return None
        if isinstance(decision, RetryDecision):
            if self.attempt < self.body.backoff.max_attempts:
                self.retry(exc, decision)
            decision = DeadLetterDecision(
                Category.EXHAUSTED, f"gave up after {self.attempt} attempts: {exc!r}", alert=True
            )
        self.give_up_claim()
        self.dead_letter(exc, decision.category, decision.reason, alert=decision.alert)
        shown = scrubbing.scrubbed(exc)  # what Celery logs, stores and sends: no personal data
        raise shown if decision.alert else expected(shown, self.request.id)  # no ERROR trace


def dead_letter_hard_timeout(
    task: JobTask, task_id: str, kwargs: dict[str, Any], exc: BaseException
) -> None:
    """The hard time limit killed the job's process: Celery acks the message in the main
    process, so the dead letter is written here, and the enqueue reservation dropped.

    The job ignored its soft time limit (which would have been retried), so it is
    treated as a bug: alerted, kept for triage and replay. Only the payload is known in
    the main process: our headers stay with the killed child.
    """
    request = SimpleNamespace(id=task_id, retries=0, hostname=None, delivery_info={})
    delivery = Delivery(task, request, {}, dict(kwargs or {}))
    try:
        payload = task.upcast_payload(task.payload.parse(delivery.kwargs, task=task.name))
        delivery.key = task.run_key(payload, {})[0]  # namespaced, as the store keeps it
    except PayloadError:
        delivery.key = None
    reason = f"killed by the hard time limit ({exc}): it ignored its soft time limit"
    with contextlib.suppress(Ignore, Reject):  # store down: published again (``defer``)
        delivery.dead_letter(exc, Category.BUG, reason, alert=True)
