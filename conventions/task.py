"""The base task: validate before publishing, validate again in the worker, then run
the body under the idempotency ledger and turn its outcome into one decision.

Publish: kwargs -> payload model (a bad call raises here, nothing is enqueued) ->
idempotency key -> enqueue dedup -> our headers -> Celery.
Run: headers -> correlation context -> payload model (a bad message is dead-lettered
as ``invalid``) -> ledger claim (done: skip; held: defer; too many deliveries: poison)
-> body(payload, ctx) -> decision (retry with backoff / dead letter / skip).
"""

from __future__ import annotations

import contextlib
import logging
import string
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, cast

from billiard.exceptions import TimeLimitExceeded
from celery import Task
from celery.result import AsyncResult
from celery.utils.time import is_naive, maybe_iso8601

from conventions.capacity import backpressure
from conventions.config.settings import Settings
from conventions.errors import ConfigurationError, KeyConflict, PayloadError
from conventions.jobs import priority
from conventions.jobs.backoff import Backoff
from conventions.jobs.contract import KeyTemplate
from conventions.jobs.decisions import DEFAULT_TABLE, DecisionTable
from conventions.jobs.payloads import Payload
from conventions.observability import audit
from conventions.schedules import entries as schedules
from conventions.store import keys, outages
from conventions.store.base import Store
from conventions.store.records import utcnow
from conventions.tracing import context, scrubbing, spans
from conventions.tracing import headers as hdr
from conventions.tracing.headers import READY
from conventions.transport import publish as onetrip
from conventions.transport import redis as broker
from conventions.worker import delivery as runner
from conventions.worker import hard_limits, signals
from conventions.worker.exits import ExpectedDeadLetter

logger = logging.getLogger("conventions.task")


class DuplicateResult(AsyncResult):  # type: ignore[misc]
    """The handle of the job that already holds this idempotency key."""

    deduplicated = True


def template_fields(template: str) -> list[str]:
    """The field names a key template uses (``"receipt:{order_id}"`` -> ``["order_id"]``)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


class ConventionTask(Task):  # type: ignore[misc]
    """Base class of every convention task; declare tasks with ``app.job(...)``."""

    typing = False
    #: marks a convention job for code that must not import this module (the wiring)
    conventions_job: ClassVar[bool] = True
    max_retries = None  # attempts are ours: see ``backoff``
    acks_late = True
    reject_on_worker_lost = True
    #: a declared dead letter's exception is an expected outcome: Celery logs it at INFO
    #: without a traceback, the layer a warning naming the record
    throws = (ExpectedDeadLetter,)
    #: the worker's request: its hard time limit hands the job's headers to ``on_failure``
    Request = "conventions.worker.hard_limits:HardLimitRequest"

    #: the pydantic payload model
    payload: ClassVar[type[Payload]]
    #: the idempotency key template over payload fields, or a callable of the payload
    key: ClassVar[KeyTemplate]
    #: may a call (``idempotency_key=``) or a message header give another key than the
    #: one ``key`` derives from the payload? Off: the key is always the declaration's
    key_override: ClassVar[bool] = False
    #: the workload the routing maps to a queue
    workload: ClassVar[str]
    #: may an operator replay this task's dead letters without ``--force``?
    replayable: ClassVar[bool] = True
    #: enqueue dedup window: "until_done", "forever", a TTL in seconds, or None (off)
    dedup: ClassVar[str | float | None] = "until_done"
    backoff: ClassVar[Backoff] = Backoff()
    decisions: ClassVar[DecisionTable] = DEFAULT_TABLE
    #: a lock template over payload fields: one job per lock runs at a time (or None)
    exclusive: ClassVar[str | None] = None
    #: the level of its messages, over its workload's (conventions.jobs.priority)
    priority_level: ClassVar[str | None] = None
    #: called with (payload, ctx) before the body when the last attempt was uncertain
    reconcile: ClassVar[Callable[..., Any] | None] = None
    #: for an upcaster: turns this task's payload into ``upcast_into``'s payload
    upcast: ClassVar[Callable[[Any], Payload] | None] = None
    upcast_into: ClassVar[ConventionTask | None] = None
    #: the dependencies (``conventions_limits`` names) whose limits the body runs under
    uses: ClassVar[tuple[str, ...]] = ()
    #: past a backpressure bound: "raise" QueueOverCapacity, or "shed" the job
    overflow: ClassVar[str] = "raise"
    #: Celery's STARTED write may wait for the claim (:mod:`conventions.results.redis`)
    rides_results: ClassVar[bool] = True

    # -- helpers ---------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return cast(Settings, self.app.conventions_settings)

    @property
    def store(self) -> Store:
        return cast(Store, self.app.store)

    def key_for(self, payload: Payload) -> str:
        """The idempotency key of ``payload``."""
        if callable(self.key):
            return str(cast(Callable[[Any], str], self.key)(payload))
        return self.key.format(**payload.model_dump(mode="json"))

    def upcast_payload(self, payload: Payload) -> Payload:
        """The payload the body runs with: converted when this task is an upcaster."""
        if self.upcast is None:
            return payload
        return cast(Callable[[Any], Payload], self.upcast)(payload)

    def _body_task(self) -> ConventionTask:
        return self.upcast_into if self.upcast_into is not None else self

    # -- publish -----------------------------------------------------------------------
    def apply_async(  # noqa: PLR0917  (Celery's signature)
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        **options: Any,
    ) -> AsyncResult:
        """Validate, dedup and publish; a bad call raises here and enqueues nothing."""
        celery_args = (producer, link, link_error, shadow)
        traces = spans.active()  # None unless this process traces: never imports OpenTelemetry
        if traces is None:
            return self._apply(args, kwargs, task_id, celery_args, options)
        with traces.publishing(self) as note:  # the publish span (conventions.tracing.otel)
            result = self._apply(args, kwargs, task_id, celery_args, options)
            note(result)
            return result

    def _apply(
        self,
        args: Any,
        kwargs: Any,
        task_id: str | None,
        celery_args: tuple[Any, ...],
        options: dict[str, Any],
    ) -> AsyncResult:
        producer, link, link_error, shadow = celery_args
        if options.get(READY):  # already checked: a retry, a defer, a replay's own publish
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        if args:
            raise PayloadError(
                f"{self.name} takes keyword arguments only: call .delay(field=value, ...)",
                errors=[{"loc": [], "msg": "positional arguments are refused", "type": "args"}],
                task=self.name,
            )
        options = self.with_level(options)
        data, key, headers = self.prepare(kwargs, options)
        # a batch member's keys are in its batch's slot on Redis Cluster (keys.batch_home)
        with keys.batch_home(key, keys.batch_root(headers.get(hdr.BATCH))):
            return self._reserve_and_publish(data, key, headers, task_id, celery_args, options)

    def with_level(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with the job's level (its own, else its workload's) as the message
        priority when the call names none. Celery applies ``task_default_priority`` over
        the router's priority, so a level left to the router alone would lose to the
        default the capacity how-to sets (``3``): every job would wait as ``normal``. A
        call's own ``priority=`` still wins."""
        if options.get("priority") is not None:
            return options
        level = priority.level_of(self, getattr(self, "workload", None) or "")
        if level is None:
            return options
        return {**options, "priority": priority.message_priority(self.app.conf, level)}

    def _reserve_and_publish(  # noqa: PLR0917
        self,
        data: dict[str, Any],
        key: str,
        headers: dict[str, Any],
        task_id: str | None,
        celery_args: tuple[Any, ...],
        options: dict[str, Any],
    ) -> AsyncResult:
        producer, link, link_error, shadow = celery_args
        fingerprint = keys.fingerprint(self.name, data)  # one key, one payload
        task_id = task_id or str(uuid.uuid4())
        store = self.store
        published = audit.event(
            "published", self.name, task_id, headers, detail=audit.due_detail(options)
        )
        refusal = backpressure.check(self, options)  # None unless a queue bound is crossed
        if refusal is None and onetrip.eligible(self.app, store):
            return self._publish_in_one_trip(
                data, (key, fingerprint), headers, task_id, published,
                (producer, link, link_error, shadow), options,
            )  # fmt: skip
        if self.dedup is not None:
            # one round trip: the reservation and, when it is ours, the audit event
            with onetrip.bounded(self.app.conf, "store"):
                holder = store.reserve(
                    key, task_id, self.dedup_ttl(), audit=None if refusal else published,
                    fingerprint=fingerprint,
                )  # fmt: skip
            if holder is not None:
                return self._duplicate_of(holder, headers, key, fingerprint)
        if refusal is not None:
            return backpressure.refuse(self, refusal, key, task_id, headers)
        try:
            with onetrip.bounded(self.app.conf, "broker"):
                result = super().apply_async(
                    (), data, task_id, producer, link, link_error, shadow, headers=headers,
                    kwargsrepr=_kwargsrepr(data, headers), **{READY: True}, **options,
                )  # fmt: skip
        except BaseException as exc:
            self._publish_failed(key, task_id, headers, exc)
            raise
        if self.dedup is None:
            with contextlib.suppress(*outages.UNREACHABLE):  # published: only its event lost
                store.add_audit(published)
        result.deduplicated = False
        return result

    def _publish_in_one_trip(  # noqa: PLR0917
        self,
        data: dict[str, Any],
        keyed: tuple[str, str],
        headers: dict[str, Any],
        task_id: str,
        published: Any,
        celery_args: tuple[Any, ...],
        options: dict[str, Any],
    ) -> AsyncResult:
        """Publish with the reservation (``keyed``: key and payload fingerprint) inside
        the push (:mod:`conventions.transport.publish`)."""
        key, fingerprint = keyed
        pushed = onetrip.hook(
            self.store, task_id, key if self.dedup is not None else None, self.dedup_ttl(),
            published, fingerprint,
        )  # fmt: skip
        if self.app.conf.task_send_sent_event:  # the event goes in the push's script
            pushed.with_event = True
            options.setdefault("event_dispatcher", onetrip.sent_events(self.app))
        try:
            with onetrip.bounded(self.app.conf, "broker"), broker.pushing_through(pushed):
                result = super().apply_async(
                    (), data, task_id, *celery_args, headers=headers,
                    kwargsrepr=_kwargsrepr(data, headers), **{READY: True}, **options,
                )  # fmt: skip
                pushed.flush()  # its event went another way: pushed now
        except onetrip.Deduplicated as duplicate:
            onetrip.forget(self.app, task_id)
            return self._duplicate_of(duplicate.holder, headers, key, fingerprint)
        except BaseException as exc:
            if pushed.tried:  # else nothing was reserved, nor pushed
                self._publish_failed(key, task_id, headers, exc)
            raise
        if not pushed.ran:  # another producer's connection published it: no reservation
            logger.warning("%s[%s] was published without its reservation", self.name, task_id)
            self.store.add_audit(published)
        result.deduplicated = False
        return result

    def _duplicate_of(
        self, holder: str, headers: dict[str, Any], key: str, fingerprint: str
    ) -> DuplicateResult:
        """The holder's handle, for a publish whose key another job holds (nothing was
        enqueued), with its ``deduplicated`` audit event; KeyConflict when the holder
        reserved it for another payload (never taken for this one)."""
        if keys.conflicting(getattr(holder, "fingerprint", None), fingerprint):
            raise KeyConflict(key=key, task=self.name)
        audit.record(
            self.store, "deduplicated", self.name, holder, headers,
            detail={"duplicate_of": holder},
        )  # fmt: skip
        return DuplicateResult(holder, app=self.app)

    def _publish_failed(
        self, key: str, task_id: str, headers: dict[str, Any], exc: BaseException
    ) -> None:
        """Give the key back and say so, when a publish raised (nothing was enqueued).
        A store that is down too keeps the reservation until its ttl: said in the log."""
        if self.dedup is not None:
            try:
                self.store.unreserve(key, task_id)
            except outages.UNREACHABLE:
                logger.warning("%s[%s]: the store is unavailable: a reservation of %r made "
                               "before the failure stays until it expires", self.name, task_id,
                               key)  # fmt: skip
                return
            audit.record(
                self.store, "publish_failed", self.name, task_id, headers,
                detail={"exc_type": type(exc).__qualname__},
            )  # fmt: skip

    def prepare(
        self, kwargs: Any, options: dict[str, Any]
    ) -> tuple[dict[str, Any], str, dict[str, Any]]:
        """The message of a call, checked: ``(payload data, idempotency key, headers)``.

        Pops ``idempotency_key`` and ``headers`` from ``options``. ``.delay()`` and
        ``outbox.add`` both go through here, so an outbox row is what ``.delay()`` would
        have published. A bad call raises ``PayloadError`` (or ``ConfigurationError``).
        """
        payload = self.payload.parse(dict(kwargs or {}), task=self.name)
        data = payload.to_message()
        self._check_delay(options)
        body = self._body_task()
        derived = body.key_for(self.upcast_payload(payload))
        explicit = options.pop("idempotency_key", None)
        headers = context.outgoing(options.pop("headers", None))
        key = derived
        if explicit:
            key = keys.bare(body.name, str(explicit))
            if key != derived and not (self.key_override or _beat_key(key, headers)):
                raise ConfigurationError(
                    f"{self.name}: idempotency_key={str(explicit)!r} would replace the key "
                    f"the task declares ({derived!r}); a task whose key may be given per "
                    "call declares key_override=True"
                )
        headers[hdr.IDEMPOTENCY_KEY] = keys.checked(self.name, key)
        headers.setdefault(hdr.ENQUEUED_AT, utcnow().isoformat())
        return data, keys.namespaced(body.name, key), headers

    def run_key(self, payload: Payload, headers: Mapping[str, Any]) -> tuple[str, str]:
        """``(store key, key)`` a delivery of ``payload`` (the body's form) runs under:
        the one the declaration derives from the payload. A key the message carries
        (``cc_idempotency_key``, from any producer) is taken instead only for a task
        declared ``key_override=True``, or when it is the occurrence key of a schedule
        entry of this app that sends this task; else it is ignored. PayloadError when
        the key is empty or too long (:func:`conventions.store.keys.checked`)."""
        body = self._body_task()
        key = body.key_for(payload)
        carried = headers.get(hdr.IDEMPOTENCY_KEY)
        if isinstance(carried, str) and carried:
            given = keys.bare(body.name, carried)
            if given != key and (self.key_override or _scheduled(self, given, headers)):
                key = given
            elif given != key:
                logger.warning("%s: ignored the key %r the message carries; runs under %r",
                               self.name, scrubbing.scrub_text(given[:80]), key)  # fmt: skip
        key = keys.checked(self.name, key)
        return keys.namespaced(body.name, key), key

    def dedup_ttl(self) -> float | None:
        """How long a publish's enqueue reservation lasts (None: until released)."""
        if isinstance(self.dedup, int | float):
            return float(self.dedup)
        if self.dedup == "forever":
            return None
        return self.settings.ledger_keep  # "until_done": released at the end, bounded

    def _check_delay(self, options: dict[str, Any]) -> None:
        """Refuse a delay beyond the broker's safe maximum (a year through the layer's
        Redis transport, whose delayed sets hold it; below the visibility timeout on
        kombu's own); ``eta`` is read as Celery's worker reads it (an ISO 8601 string or
        a datetime, naive meaning UTC) and passed on as an aware datetime. An ``eta``
        Celery cannot read is refused here: its worker would reject the message
        (InvalidTaskError) and the job would be lost."""
        countdown = options.get("countdown")
        if options.get("eta") is not None:
            options["eta"] = eta = self._eta_moment(options["eta"])
            countdown = (eta - utcnow()).total_seconds()
        limit = self.settings.max_countdown
        if countdown is not None and float(countdown) > limit:
            raise ConfigurationError(
                f"{self.name}: a countdown of {float(countdown):.0f}s is beyond the broker's "
                f"safe maximum of {limit:.0f}s (a worker holds a message not yet due, and "
                "kombu's Redis transport redelivers it after the visibility timeout): use the "
                "layer's Redis transport (any delay up to a year), or schedule the job with beat"
            )

    def _eta_moment(self, eta: Any) -> datetime:
        """``eta`` as an aware datetime, or ConfigurationError saying what is accepted."""
        moment = eta
        if isinstance(eta, str):
            try:
                moment = maybe_iso8601(eta)
            except (ValueError, OverflowError) as exc:
                moment = exc
        if not isinstance(moment, datetime):
            raise ConfigurationError(
                f"{self.name}: eta={eta!r} is not a moment Celery can read: pass a datetime "
                "(timezone-aware; a naive one is read as UTC) or an ISO 8601 string, or use "
                "countdown= seconds"
            )
        return moment.replace(tzinfo=UTC) if is_naive(moment) else moment

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Celery calls this in the main process when the hard time limit kills a job
        (with the job's request, headers and all: :mod:`conventions.worker.hard_limits`);
        every other failure was already decided by the runner in the child."""
        if isinstance(exc, TimeLimitExceeded):
            request = hard_limits.timed_out_request(task_id)
            runner.dead_letter_hard_timeout(self, task_id, kwargs, exc, request)

    # -- run ---------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            raise ConfigurationError(
                f"{self.name} runs in a worker: publish it with .delay(), or call the "
                "body function directly in a unit test"
            )
        trace = context.from_request(request)
        token = context.activate(context.for_child(trace, request.id))
        try:
            return runner.run(self, request, trace, args, kwargs)
        finally:
            context.reset(token)


def _beat_key(key: str, headers: Mapping[str, Any]) -> bool:
    """Whether ``key`` is the occurrence key (``beat:<entry>:<label>``) of the schedule
    entry the headers name: the key ``conventions.schedules.beat`` gives explicitly."""
    entry = headers.get(hdr.SCHEDULE)
    return isinstance(entry, str) and bool(entry) and key.startswith(f"beat:{entry}:")


def _scheduled(task: ConventionTask, key: str, headers: Mapping[str, Any]) -> bool:
    """Whether a message's ``key`` is a beat occurrence key of an entry of this app's
    schedule (``conventions_schedule``) that sends ``task``: a header alone never makes
    a payment job run under another key."""
    if not _beat_key(key, headers):
        return False
    return bool(_schedule_of(task.app).get(str(headers[hdr.SCHEDULE])) == task.name)


def _schedule_of(app: Any) -> dict[str, str]:
    """Entry name -> task name of the app's schedule, read once per app and setting (an
    unreadable schedule is none: its messages run under their declared keys)."""
    setting = app.conf.get("conventions_schedule")
    cached = app.__dict__.get("_cc_scheduled_tasks")
    if cached is None or cached[0] is not setting:
        try:
            found = {entry.name: entry.task for entry in schedules.entries_of(app)}
        except Exception:
            logger.warning("could not read conventions_schedule", exc_info=True)
            found = {}
        cached = app.__dict__["_cc_scheduled_tasks"] = (setting, found)
    return cast(dict[str, str], cached[1])


def _kwargsrepr(data: dict[str, Any], headers: dict[str, Any]) -> str:
    """What Flower shows as kwargs (:func:`conventions.worker.signals.kwargs_shown`)."""
    return signals.kwargs_shown(data, headers)
