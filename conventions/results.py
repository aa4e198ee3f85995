"""Celery's Redis result backend, with the ledger's claim and completion riding its writes.

With ``task_track_started``, Celery writes a job's STARTED state before the body and its
SUCCESS after; the runner claims the key before the body and completes it after. On one
Redis server that is four round trips where two do, and on this machine a round trip
costs more than the layer's whole Python per job. Select this backend
(``result_backend = "conventions.results:RedisBackend+redis://..."``, as ``celeryconfig``
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

Anything else (another server, the SQL store, a plain Celery task) goes through Celery's
backend unchanged. The result documents, keys and expiry are Celery's own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import states
from celery._state import get_current_task
from celery.app.task import get_actual_ignore_result
from celery.backends.redis import RedisBackend as CeleryRedisBackend
from kombu.utils.encoding import bytes_to_str

from conventions.records import AuditEvent, Claim
from conventions.store.redis import RedisStore, database_of
from conventions.store.redis_results import ResultWrite

logger = logging.getLogger("conventions.results")

#: a task class attribute: its STARTED write may wait for its claim
RIDES = "rides_results"

_local = threading.local()  # per worker thread (per greenlet when patched)


@dataclass
class _Completion:
    """The runner's completion: run now, or waiting for the SUCCESS write of
    ``result_key``."""

    result_key: str
    store: Any
    args: tuple[str, str, str, float, str | None]
    audit: AuditEvent
    after: Callable[[], None]

    def run(self, result: ResultWrite | None) -> None:
        """Complete the key (with ``result`` in the same script when given), then
        ``after``."""
        riding = {} if result is None else {"result": result}  # any store, or the Redis one
        self.store.complete(*self.args, audit=self.audit, **riding)
        self.after()


class RedisBackend(CeleryRedisBackend):  # type: ignore[misc]
    """Celery's Redis backend that hands a convention job's STARTED and SUCCESS writes to
    the store's claim and completion (see the module)."""

    def _set_with_state(self, key: Any, value: Any, state: str) -> Any:
        if state == states.STARTED and self._hold_started(bytes_to_str(key), value):
            return None
        pending: _Completion | None = getattr(_local, "completion", None)
        if (
            state == states.SUCCESS
            and pending is not None
            and pending.result_key == bytes_to_str(key)
            and len(value) <= self._MAX_STR_VALUE_SIZE
        ):
            # a lost connection raises here and Celery's store_result tries again
            pending.run(self.write(key, value))
            _local.completion = None
            return None
        return super()._set_with_state(key, value, state)

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
        if isinstance(store, RedisStore) and store.shares_server(
            kwargs.get("host") or kwargs.get("path"), kwargs.get("port")
        ):
            answer = store
        self.__dict__["_cc_alongside"] = (store, answer)
        return answer

    def _hold_started(self, key: str, value: Any) -> bool:
        task = get_current_task()
        if task is None or not getattr(task, RIDES, False):
            return False
        if self.store_alongside(task.store) is None or key != self.result_key(task.request.id):
            return False
        _local.started = (task.request.id, self.write(key, value))
        return True


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
) -> None:
    """``task.store.complete(key, owner, "succeeded", ...)`` and then ``after()``: now, or
    in the same script as Celery's SUCCESS write when one follows the body."""
    backend, request = task.backend, task.request
    riding = isinstance(backend, RedisBackend) and backend.store_alongside(task.store) is not None
    completion = _Completion(
        "", task.store, (key, owner, "succeeded", keep, reserved_by), audit, after
    )
    if riding and _success_write_follows(task, request):
        completion.result_key = backend.result_key(request.id)
        _local.completion = completion
    else:
        completion.run(None)


def _success_write_follows(task: Any, request: Any) -> bool:
    """Whether Celery stores SUCCESS right after the body returns (``trace_task``)."""
    return not (
        request.is_eager
        or get_actual_ignore_result(task, request)
        or request.callbacks
        or request.chain
    )


def settle() -> None:
    """After a job (``task_postrun``): a completion that no result write took runs now; a
    held STARTED write that no claim took is dropped."""
    _local.started = None
    pending: _Completion | None = getattr(_local, "completion", None)
    if pending is None:
        return
    _local.completion = None
    try:
        pending.run(None)
    except Exception:  # the lease runs out and a redelivery or replay runs the body again
        logger.error("could not record %s as done", pending.args[0], exc_info=True)
