"""Backpressure for producers: a bound on a queue's depth or on its oldest job's age.

Off by default. Turn it on per queue in ``celeryconfig.py``::

    conventions_backpressure = {"email": {"max_depth": 10_000, "max_age": 300}}

Past a bound, ``.delay()`` of a task routed to that queue follows the task's
``overflow`` policy: ``"raise"`` (the default) raises :class:`QueueOverCapacity` and
publishes nothing; ``"shed"`` drops the job, records a ``shed`` audit event and returns a
:class:`ShedResult` (``.shed == True``). Retries and deferrals of jobs already accepted
are never refused: backpressure only stops *new* work.

The reading is cheap (one pipelined ``LLEN`` + ``LINDEX -1`` per priority step of the
Redis list; the oldest message's ``cc_enqueued_at`` header gives its age) and cached per
process for :data:`READING_TTL` seconds, counting this process's own publishes since.
Several producers may therefore overshoot a bound by what they publish within one
reading's life. Jobs a worker already holds (prefetched, or waiting for an ETA) are not
in the list and do not count.

On RabbitMQ (``amqp://``) ``max_depth`` reads the queue's ready messages with one
passive ``queue.declare`` (cached the same way; delivered and unacked ones do not count).
The oldest job's age cannot be read there, so a ``max_age`` bound on an AMQP broker is a
:class:`ConfigurationError` at the first publish that reads it, not a bound that never
trips.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis
from celery.result import AsyncResult

from conventions.config import profile, sentinel
from conventions.config.capacity import Bound
from conventions.errors import ConfigurationError, QueueOverCapacity
from conventions.jobs import routing
from conventions.observability import audit
from conventions.observability import queues as queueslib
from conventions.store.records import utcnow
from conventions.tracing import headers as hdr

if TYPE_CHECKING:
    from conventions.jobs.protocol import JobTask

#: seconds a queue reading is reused by one process
READING_TTL = 1.0
#: kombu's default Redis priority steps, and the separator of a priority list's name
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"
#: the overflow policies a task may declare
POLICIES = ("raise", "shed")


@dataclass
class Reading:
    depth: int
    oldest_age: float | None
    taken_at: float


class ShedResult(AsyncResult):  # type: ignore[misc]
    """The handle of a job that backpressure dropped: it was never published."""

    shed = True
    deduplicated = False

    def get(self, *args: Any, **kwargs: Any) -> Any:
        raise QueueOverCapacity(f"job {self.id} was shed: its queue was over capacity")


class Gauge:
    """Per-process cached readings of queue lists on the Redis broker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readings: dict[str, Reading] = {}
        self._clients: dict[str, redis.Redis] = {}
        self._amqp: dict[str, Any] = {}

    def read(self, app: Any, queue: str) -> Reading:
        now = time.monotonic()
        with self._lock:
            cached = self._readings.get(queue)
            if cached is not None and now - cached.taken_at < READING_TTL:
                return cached
        reading = self._measure(app, queue, now)
        with self._lock:
            self._readings[queue] = reading
        return reading

    def published(self, queue: str) -> None:
        """Count a publish of this process into the cached reading."""
        with self._lock:
            if queue in self._readings:
                self._readings[queue].depth += 1

    def forget(self) -> None:
        with self._lock:
            self._readings.clear()

    def _client(self, app: Any) -> redis.Redis:
        url = str(app.conf.broker_url or "")
        if not url.startswith(("redis://", "rediss://", "unix://", *sentinel.SCHEMES)):
            raise ConfigurationError(
                "conventions_backpressure reads queue lists on a Redis broker or RabbitMQ "
                f"(amqp://); broker_url {url.split('://', maxsplit=1)[0]}:// is not supported"
            )
        with self._lock:
            client = self._clients.get(url)
            if client is None:  # on Sentinel, the group's current primary
                options = app.conf.get("broker_transport_options") or {}
                client = sentinel.broker_client(url, options)
                self._clients[url] = client
        return client

    def _connection(self, url: str, timeout: float) -> Any:
        from kombu import Connection

        with self._lock:
            connection = self._amqp.get(url)
            if connection is None:
                connection = Connection(url, connect_timeout=timeout)
                self._amqp[url] = connection
        return connection

    def _measure_amqp(self, app: Any, queue: str, now: float) -> Reading:
        """The ready messages of ``queue`` on RabbitMQ (0 when it is not declared)."""
        url = str(app.conf.broker_url or "")  # a failover list: kombu tries each in turn
        timeout = float(app.conf.get("broker_connection_timeout") or 5.0)
        connection = self._connection(url, timeout)
        with self._lock:  # one channel at a time on the shared connection
            connection.ensure_connection(max_retries=1)
            found = queueslib.declared(connection, queue)
        return Reading(found[0] if found else 0, None, now)

    def _measure(self, app: Any, queue: str, now: float) -> Reading:
        if profile.is_amqp(app.conf.broker_url):
            return self._measure_amqp(app, queue, now)
        options = app.conf.get("broker_transport_options") or {}
        prefix = str(options.get("global_keyprefix") or "")
        steps = options.get("priority_steps") or PRIORITY_STEPS
        names = [f"{prefix}{queue}" + (f"{PRIORITY_SEP}{p}" if p else "") for p in steps]
        with self._client(app).pipeline(transaction=False) as pipe:
            for name in names:
                pipe.llen(name)
                pipe.lindex(name, -1)
            replies = pipe.execute()
        depth = sum(int(n) for n in replies[0::2])
        ages = [_age(raw) for raw in replies[1::2] if raw is not None]
        known = [age for age in ages if age is not None]
        return Reading(depth, max(known) if known else None, now)


def _age(raw: bytes) -> float | None:
    """Seconds since the message's first publish (``cc_enqueued_at``), if it says."""
    try:
        headers = json.loads(raw).get("headers") or {}
        stamp = headers.get(hdr.ENQUEUED_AT)
        return (utcnow() - datetime.fromisoformat(stamp)).total_seconds() if stamp else None
    except (ValueError, TypeError, AttributeError):
        return None


#: the process-wide gauge
gauge = Gauge()


def publish_queue(task: JobTask, options: Mapping[str, Any]) -> str | None:
    """The queue a publish goes to: ``queue=`` when given, else the workload's queue."""
    queue = options.get("queue")
    if queue is not None:
        return str(getattr(queue, "name", queue))
    return routing.workloads(task.app.conf).get(task.workload)


def over(bound: Bound, reading: Reading) -> str | None:
    """Why ``reading`` is past ``bound``, or None."""
    if bound.max_depth is not None and reading.depth >= bound.max_depth:
        return f"{reading.depth} jobs waiting, bound {bound.max_depth}"
    age = reading.oldest_age
    if bound.max_age is not None and age is not None and age > bound.max_age:
        return f"oldest job waiting {age:.0f}s, bound {bound.max_age:.0f}s"
    return None


@dataclass(frozen=True)
class Refusal:
    queue: str
    reason: str


def _bound(task: JobTask, queue: str | None) -> Bound | None:
    """``queue``'s bound (None: unbounded); a bound a broker cannot read is refused."""
    bound = task.settings.backpressure.get(queue) if queue is not None else None
    if (
        bound is not None
        and bound.max_age is not None
        and profile.is_amqp(task.app.conf.broker_url)
    ):
        raise ConfigurationError(
            f"conventions_backpressure[{queue!r}]['max_age']: RabbitMQ does not tell a "
            "queue's oldest message's age (a passive queue.declare gives depth and "
            "consumers only); bound it by max_depth"
        )
    return bound


def check(task: JobTask, options: Mapping[str, Any]) -> Refusal | None:
    """Why a publish of ``task`` must not go on now, or None (always None when the
    task's queue has no bound: one dict lookup)."""
    queue = publish_queue(task, options) if task.settings.backpressure else None
    bound = _bound(task, queue)
    if bound is None or queue is None:
        return None
    reason = over(bound, gauge.read(task.app, queue))
    if reason is None:
        gauge.published(queue)
        return None
    return Refusal(queue, reason)


def room_for(task: JobTask, queue: str, count: int) -> Refusal | None:
    """Why ``count`` publishes to ``queue`` (of ``task``'s app) would cross its bound now,
    or None: a batch's members are admitted together (counted by each publish after)."""
    bound = _bound(task, queue) if task.settings.backpressure else None
    if bound is None:
        return None
    reading = gauge.read(task.app, queue)
    if bound.max_depth is not None and reading.depth + count > bound.max_depth:
        return Refusal(
            queue, f"{reading.depth} jobs waiting and {count} more, bound {bound.max_depth}"
        )
    reason = over(bound, reading)
    return None if reason is None else Refusal(queue, reason)


def refuse(
    task: JobTask, refusal: Refusal, key: str, task_id: str, headers: dict[str, Any]
) -> ShedResult:
    """Apply the task's policy to a publish past a bound (after the dedup check: a
    duplicate of an accepted job still gets its handle): drop the key's reservation,
    record ``refused`` or ``shed``, then raise :class:`QueueOverCapacity` or return a
    :class:`ShedResult`."""
    store = task.store
    if task.dedup is not None:
        store.unreserve(key, task_id)
    shed = task.overflow == "shed"
    audit.record(
        store, "shed" if shed else "refused", task.name, task_id, headers,
        detail={"queue": refusal.queue, "reason": refusal.reason},
    )  # fmt: skip
    if not shed:
        raise QueueOverCapacity(
            f"queue {refusal.queue!r} is over capacity ({refusal.reason}): {task.name} "
            "was not published; try again later or slow the producer down",
            queue=refusal.queue,
        )
    return ShedResult(task_id, app=task.app)
