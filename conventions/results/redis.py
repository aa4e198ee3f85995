"""Celery's Redis result backend, with the ledger's claim and completion riding its writes.

With ``task_track_started``, Celery writes a job's STARTED state before the body and its
SUCCESS after; the runner claims the key before the body and completes it after. On one
Redis server that is four round trips where two do, and on this machine a round trip
costs more than the layer's whole Python per job. Select this backend
(``result_backend = "conventions.results.redis:RedisBackend+redis://..."``, as ``celeryconfig``
does) and, when the store is a :class:`~conventions.store.redis.RedisStore` on the same
server (any database):

* Celery's STARTED write of a convention job is held back, and the runner's claim sends
  it in its own script (:mod:`conventions.store.redis_results`). A delivery that never
  claims (an invalid payload, a deferral) stays PENDING instead of STARTED, which is what
  it is.
* The runner's completion waits for Celery's SUCCESS write and goes out in the same
  script, so the ledger says done in the same step as the result. When Celery would not
  write SUCCESS right after the body (results ignored, eager mode, callbacks or a chain
  that are dispatched before the write) the completion runs by itself, as before.
* Whatever no write took runs at ``task_postrun`` (:func:`settle`): a completion is
  never left behind, so the ledger says done before the message is acked.

A completion waits for a store that does not answer (a lost connection, a timeout):
it is tried again until the job's deadline (:data:`COMPLETION_PATIENCE`, and a second
before its time limit), whatever ``result_backend_always_retry`` says, because the body
ran and the ledger must say so. The riding SUCCESS write waits the same way. The lease
keeper renews the claim meanwhile (``hold`` to ``let_go``). A completion run inside
the job (any other store) that is still refused at the deadline raises, and the runner
gives the message back to the broker; a riding one, after which Celery records FAILURE
and acks, has the runner publish a copy of the job first (``give_back``).

Anything else (another server, the SQL store, a plain Celery task) goes through Celery's
backend unchanged. The result documents, keys and expiry are Celery's own.

On Redis Sentinel, :class:`SentinelBackend` (``result_backend =
"conventions.results.redis:SentinelBackend+sentinel://a:26379/0;sentinel://b:26379/0"``
with ``result_backend_transport_options={"master_name": ...}``) is Celery's Sentinel
backend with the same riding writes, when the store follows the same group
(``sentinel://...?master_name=``): the claim and completion scripts, and the result
writes they carry, run on the current primary.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from celery import states
from celery._state import get_current_task
from celery.app.task import get_actual_ignore_result
from celery.backends.redis import RedisBackend as CeleryRedisBackend
from celery.backends.redis import SentinelBackend as CelerySentinelBackend
from kombu.utils.encoding import bytes_to_str

from conventions.config import sentinel
from conventions.jobs.decisions import DEFAULT_TABLE, RetryDecision
from conventions.observability.deadletters import CappedRequest
from conventions.store.batches import BatchMove
from conventions.store.records import AuditEvent, Claim
from conventions.store.redis import RedisStore, database_of
from conventions.store.redis_results import ResultWrite

logger = logging.getLogger("conventions.results.redis")

#: a task class attribute: its STARTED write may wait for its claim
RIDES = "rides_results"

#: how long (seconds) a job whose body ran waits for the store to take its completion
#: when it does not answer; the job's time limit shortens it (see the module)
COMPLETION_PATIENCE = 60.0
#: the first and the longest pause between two tries (seconds)
PAUSES = (0.05, 2.0)

#: what ``_set_with_state(..., riding_only=True)`` answers for a write no script took
_NOT_RIDDEN = object()
_local = threading.local()  # per worker thread (per greenlet when patched)
T = TypeVar("T")


def retryable(exc: BaseException) -> bool:
    """Whether a completion's write that raised ``exc`` is tried again: a transient
    error of the default decisions table (connection refused or lost, timeouts, DB
    operational errors, a locked SQLite among them), wider than an outage
    (:func:`conventions.store.outages.unreachable`)."""
    return isinstance(DEFAULT_TABLE.decide(exc), RetryDecision)


def patiently(call: Callable[[], T], deadline: float, what: str, on_wait: Callable[[], None]) -> T:
    """``call()``, tried again while the server does not answer and ``deadline``
    (``time.monotonic()``) is ahead; then its last error is raised. ``on_wait()`` runs
    before the first wait."""
    pause = PAUSES[0]
    while True:
        try:
            return call()
        except Exception as exc:
            if not retryable(exc) or time.monotonic() + pause > deadline:
                raise
            if pause == PAUSES[0]:
                logger.warning("%s: the server does not answer (%s); trying again", what,
                               type(exc).__qualname__)  # fmt: skip
                on_wait()
            time.sleep(pause)
            pause = min(pause * 2, PAUSES[1])


@dataclass
class _Completion:
    """The runner's completion: run now, or waiting for the SUCCESS write of
    ``result_key``."""

    result_key: str
    store: Any
    args: tuple[str, str, str, float, str | None]
    audit: AuditEvent
    after: Callable[[], None]
    #: the lease keeper renews the claim while the completion waits for the store...
    hold: Callable[[], None]
    #: ...until the completion is recorded or given up
    let_go: Callable[[], None]
    #: until when (``time.monotonic()``) a store that does not answer is waited for
    deadline: float
    #: publishes a copy of the job, for a riding write refused past the deadline
    give_back: Callable[[], None] = lambda: None
    #: the payload fingerprint recorded with done (the same-key check of a later claim)
    fingerprint: str | None = None
    #: the delivery whose claim counter the completion drops
    delivery_id: str | None = None
    #: the job's end in its batches, moved with the completion
    batch: BatchMove | None = None
    #: publishes the batch callbacks the completion made due
    on_fired: Callable[[list[str]], None] = lambda fired: None

    def attempt(self, result: ResultWrite | None) -> None:
        """Complete the key once (with ``result`` in the same script when given), then
        ``after``."""
        riding: dict[str, Any] = {} if result is None else {"result": result}  # any store
        if self.delivery_id is not None:
            riding["delivery_id"] = self.delivery_id
        if self.batch is not None:
            riding["batch"] = self.batch
        fired = self.store.complete(
            *self.args, audit=self.audit, fingerprint=self.fingerprint, **riding
        )
        self.after()
        if self.batch is not None and fired:
            self.on_fired(list(fired))

    def run(self) -> None:
        """Complete the key by itself, patiently (see the module), then let go; past the
        deadline (a riding write waited already), one try."""
        try:
            patiently(
                lambda: self.attempt(None), self.deadline, f"recording {self.args[0]} done",
                self.hold,
            )  # fmt: skip
        finally:
            self.let_go()


class RedisBackend(CeleryRedisBackend):  # type: ignore[misc]
    """Celery's Redis backend that hands a convention job's STARTED and SUCCESS writes to
    the store's claim and completion (see the module)."""

    def on_task_call(self, producer: Any, task_id: str) -> None:
        """Subscribe to nothing at publish. Celery's backend subscribes to every job's
        result channel as it is sent (and unsubscribes when it ends): two round trips
        per ``.delay()``, for a result most callers never read. A caller that does
        (``AsyncResult.get()``, ``then()``) subscribes at that moment, and Celery reads
        the stored result right after subscribing (``on_wait_for_pending``), so a job
        that finished before the ``get()`` is found all the same."""

    def _set_with_state(self, key: Any, value: Any, state: str, riding_only: bool = False) -> Any:
        """Hand a STARTED or SUCCESS write to the ledger script it rides; else Celery's
        write (or, with ``riding_only``, :data:`_NOT_RIDDEN` and no write)."""
        if state == states.STARTED and self._hold_started(bytes_to_str(key), value):
            return None
        pending: _Completion | None = getattr(_local, "completion", None)
        if (
            state == states.SUCCESS
            and pending is not None
            and pending.result_key == bytes_to_str(key)
            and len(value) <= self._MAX_STR_VALUE_SIZE
        ):
            # a lost connection raises here and _store_result tries again
            pending.attempt(self.write(key, value))
            _local.completion = None
            pending.let_go()
            return None
        if riding_only:
            return _NOT_RIDDEN
        return super()._set_with_state(key, value, state)

    def _store_result(
        self, task_id: str, result: Any, state: str, traceback: Any = None,
        request: Any = None, **kwargs: Any,
    ) -> Any:  # fmt: skip
        """Celery's write (a FAILURE's ``args``/``kwargs`` capped as a dead letter's
        payload is); the SUCCESS write a completion rides waits for the server
        until the completion's deadline, with or without ``always_retry`` (Celery's own
        retry, when on, is left to do it)."""
        if state == states.FAILURE and request is not None:
            # a rejected 20 MB message's kwargs are not stored whole (result_extended)
            request = CappedRequest(request)
        held: _Completion | None = getattr(_local, "completion", None)
        store = super()._store_result
        if self._rides(task_id, state, held):
            store = self._store_riding  # the script keeps Celery's rule: no GET first
        write = partial(store, task_id, result, state, traceback, request=request, **kwargs)
        if state != states.SUCCESS or held is None or self.always_retry:
            return write()
        pending: _Completion = held
        if pending.result_key != self.result_key(task_id):
            return write()
        try:
            return patiently(
                write, pending.deadline, f"recording {pending.args[0]} done", pending.hold
            )
        except Exception as exc:
            if retryable(exc) and getattr(_local, "completion", None) is pending:
                # Celery records FAILURE and acks: a copy keeps the job (its body runs
                # again), and settle does not try once more behind its back
                _local.completion = None
                pending.let_go()
                pending.give_back()
            raise

    def _rides(self, task_id: str, state: str, held: _Completion | None) -> bool:
        """Will this write go out inside a ledger script (:meth:`_set_with_state`)?"""
        if state == states.SUCCESS:
            return held is not None and held.result_key == self.result_key(task_id)
        if state != states.STARTED:
            return False
        task = get_current_task()
        return bool(task is not None and getattr(task, RIDES, False) and task.request.id == task_id)

    def _store_riding(
        self, task_id: str, result: Any, state: str, traceback: Any = None,
        request: Any = None, **kwargs: Any,
    ) -> Any:  # fmt: skip
        """Celery's ``_store_result`` without its read of the stored state: the ledger
        script the write rides does that read (``with_result``). A write that does not
        ride after all (:meth:`_set_with_state` decides) is Celery's own, read included."""
        meta = self._get_result_meta(result=result, state=state, traceback=traceback,
                                     request=request)  # fmt: skip
        meta["task_id"] = bytes_to_str(task_id)
        key, value = self.get_key_for_task(task_id), self.encode(meta)
        if self._set_with_state(key, value, state, riding_only=True) is _NOT_RIDDEN:
            return super()._store_result(
                task_id, result, state, traceback, request=request, **kwargs
            )
        return result

    def write(self, key: Any, value: Any) -> ResultWrite:
        ttl = int(self.expires) if self.expires else None
        return ResultWrite(bytes_to_str(key), value, ttl, database_of(self.client))

    def result_key(self, task_id: str) -> str:
        return str(bytes_to_str(self.get_key_for_task(task_id)))

    def store_alongside(self, store: Any) -> RedisStore | None:
        """``store`` when it is a Redis store on this backend's server (worked out once
        per store)."""
        cached = self.__dict__.get("_cc_alongside")
        if cached is not None and cached[0] is store:
            return cached[1]  # type: ignore[no-any-return]
        kwargs = self.client.connection_pool.connection_kwargs
        answer = None
        if isinstance(store, RedisStore):
            # both follow one Sentinel group (True/False), or neither: compare servers
            grouped = sentinel.same_primary(self.client, store.client)
            shared = (
                grouped
                if grouped is not None
                else store.shares_server(
                    kwargs.get("host") or kwargs.get("path"), kwargs.get("port")
                )
            )
            answer = store if shared else None
        self.__dict__["_cc_alongside"] = (store, answer)
        return answer

    def _hold_started(self, key: str, value: Any) -> bool:
        task = get_current_task()
        if task is None or not getattr(task, RIDES, False):
            return False
        try:
            store = task.store
        except Exception:  # the store cannot be opened: the run path defers the job
            return False  # at its claim; Celery's own STARTED write goes ahead
        if self.store_alongside(store) is None or key != self.result_key(task.request.id):
            return False
        _local.started = (task.request.id, self.write(key, value))
        return True


class SentinelBackend(RedisBackend, CelerySentinelBackend):  # type: ignore[misc]
    """Celery's Sentinel result backend (the current primary of ``master_name``) with
    the riding writes of :class:`RedisBackend`."""


def claim(
    task: Any, key: str, owner: str, lease: float, delivery_id: str, *, audit: AuditEvent
) -> Claim:
    """``task.store.claim``, carrying the STARTED write Celery held back for this job
    (the backend holds one only for a Redis store on its server)."""
    held: tuple[str, ResultWrite] | None = getattr(_local, "started", None)
    _local.started = None
    if held is not None and held[0] == task.request.id:
        return task.store.claim(  # type: ignore[no-any-return]
            key, owner, lease, delivery_id, audit=audit, result=held[1]
        )
    return task.store.claim(key, owner, lease, delivery_id, audit=audit)  # type: ignore[no-any-return]


def complete(
    task: Any,
    key: str,
    owner: str,
    keep: float,
    reserved_by: str | None,
    *,
    audit: AuditEvent,
    after: Callable[[], None],
    hold: Callable[[], None],
    let_go: Callable[[], None],
    deadline: float,
    give_back: Callable[[], None],
    fingerprint: str | None = None,
    delivery_id: str | None = None,
    batch: BatchMove | None = None,
    on_fired: Callable[[list[str]], None] = lambda fired: None,
) -> None:
    """``task.store.complete(key, owner, "succeeded", ...)`` and then ``after()``: now, or
    in the same script as Celery's SUCCESS write when one follows the body. A store that
    does not answer is waited for until ``deadline``, under ``hold()`` (the lease keeper)
    until ``let_go()``, once it is over (recorded or given up). Raises when a completion
    run now is still refused then; a riding one calls ``give_back()`` instead (Celery acks
    the message after the write)."""
    backend, request = task.backend, task.request
    riding = isinstance(backend, RedisBackend) and backend.store_alongside(task.store) is not None
    completion = _Completion(
        "", task.store, (key, owner, "succeeded", keep, reserved_by), audit, after, hold,
        let_go, deadline, give_back, fingerprint, delivery_id, batch, on_fired,
    )  # fmt: skip
    if riding and _success_write_follows(task, request):
        completion.result_key = backend.result_key(request.id)
        _local.completion = completion
    else:
        completion.run()


def _success_write_follows(task: Any, request: Any) -> bool:
    """Whether Celery stores SUCCESS right after the body returns (``trace_task``)."""
    return not (
        request.is_eager
        or get_actual_ignore_result(task, request)
        or request.callbacks
        or request.chain
    )


def settle() -> None:
    """After a job (``task_postrun``): a completion that no result write took runs now
    (when the store still does not answer, a copy of the job is published: Celery acks
    the message next); a held STARTED write that no claim took is dropped."""
    _local.started = None
    pending: _Completion | None = getattr(_local, "completion", None)
    if pending is None:
        return
    _local.completion = None
    try:
        pending.run()
    except Exception as exc:
        logger.error("could not record %s as done", pending.args[0], exc_info=True)
        if retryable(exc):  # Celery acks the message next: a copy keeps the job
            pending.give_back()
