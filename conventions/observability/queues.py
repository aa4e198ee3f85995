"""Queue state read straight from the Redis broker: depth, oldest waiting job, consumers,
and what the layer's transport holds beside the queue.

No events stream is needed, and no queue is ever scanned. kombu keeps each queue as a
Redis list (plus one list per priority step: ``<queue>\\x06\\x163``...); producers ``LPUSH``
and consumers ``BRPOP``, so the next message to run, the oldest waiting one, is at index
-1. A read is one pipeline of ``LLEN`` + ``LINDEX -1`` per list (both O(1)): eight commands
per queue with kombu's four priority steps, whatever the depth.

The oldest job's age is measured from when it became due: the latest of our
``cc_enqueued_at`` header, the ``cc_due`` header (the due time a message had in the
transport's delayed set) and its ETA (a retry or a deferral waits for its countdown
first). A message without any (a foreign producer) has no age of its own: the reader
then reports how long it has seen that same message at the head of the queue
(``age_source`` ``seen``), a lower bound, and ``unknown`` the first time.

The layer's Redis transport also holds messages outside the queue's lists: not yet due
(its delayed set), fetched into a consumer's inbox, claimed and running (kombu's unacked
set); and it knows which consumers are alive. Those figures come from a :data:`Holdings`
reader given to :class:`BrokerQueues` (``conventions.ops.transport_view.transport_holdings``
reads ``conventions.transport.layout``; this package sits below the transport and does
not import it). Without one they are ``None``: not read (kombu's stock transport).

Consumers come from the workers themselves (``inspect().active_queues()``, a broadcast
that waits ``timeout`` for the replies): an exporter refreshes them in the background.

On RabbitMQ (``amqp://``) :class:`AmqpQueues` reads each queue with a passive
``queue.declare``: its ready messages and its consumers, as the broker counts them. The
oldest job's age cannot be known that way (``age_source`` ``unknown``, with a ``note``
saying why), and the transport-only figures (delayed, in flight, inboxes, alive) are
``None``; a queue the broker does not have is ``not-declared``, not an error.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import redis
from kombu import Connection

from conventions.config import sentinel
from conventions.config.profile import is_amqp
from conventions.jobs import routing
from conventions.observability import levels
from conventions.observability.levels import LevelState
from conventions.tracing import headers as hdr

#: kombu's defaults for the Redis transport (``broker_transport_options`` may change them)
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"


@dataclass(frozen=True)
class Held:
    """What the layer's transport holds of one queue outside its lists."""

    #: messages not yet due (the delayed set)
    delayed: int = 0
    #: due time of the next delayed message (Unix seconds), None when none is delayed
    next_due: float | None = None
    #: messages claimed by a consumer and not yet acknowledged (running, or about to)
    in_flight: int = 0
    #: messages fetched into consumers' inboxes and not yet claimed or given back
    in_inboxes: int = 0
    #: consumers of the queue whose sign of life is fresh
    consumers_alive: int = 0
    #: the clock skew (seconds, vs the Redis server) of the live consumer of the queue
    #: farthest from it; None when none measured it
    clock_skew: float | None = None


#: reads, in a few commands whatever the depths, what the transport holds of each queue
#: (a queue it holds nothing of may be left out); the time is the reader's clock (Unix s)
Holdings = Callable[[Any, Sequence[str]], tuple[Mapping[str, Held], float]]


@dataclass(frozen=True)
class QueueState:
    """One queue as the broker holds it now."""

    queue: str
    #: messages waiting, every priority step included
    depth: int
    #: seconds the oldest waiting job has been due (None: the queue is empty, or unknown)
    oldest_age: float | None
    #: ``header`` (cc_enqueued_at / ETA), ``seen`` (a lower bound), ``unknown`` or ``empty``
    age_source: str
    #: workers consuming the queue (None: not asked)
    consumers: int | None = None
    #: messages not yet due, in the transport's delayed set (None: not read, here and below)
    delayed: int | None = None
    #: seconds until the next delayed message is due; negative: overdue by that much
    next_due_in: float | None = None
    #: messages claimed by a consumer and not yet acknowledged
    in_flight: int | None = None
    #: messages fetched into consumers' inboxes, not yet claimed
    in_inboxes: int | None = None
    #: consumers of the queue whose sign of life is fresh (the transport's liveness set)
    consumers_alive: int | None = None
    #: the largest clock skew among them (seconds vs the Redis server), None if unknown
    clock_skew: float | None = None
    #: why a figure is unknown (RabbitMQ: the oldest job's age), None when all is known
    note: str | None = None
    #: each priority step's depth and oldest age, highest first (none with one step)
    levels: tuple[LevelState, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def waiting_since(enqueued_at: Any, eta: Any, due: Any = None) -> datetime | None:
    """When a job became due: the latest of its publish time, its due time in the
    delayed set and its ETA."""
    parsed = (_parse_time(enqueued_at), _parse_time(due), _parse_time(eta))
    times = [t for t in parsed if t is not None]
    return max(times) if times else None


def waited(
    enqueued_at: Any, eta: Any, now: datetime | None = None, due: Any = None
) -> float | None:
    """Seconds a job has waited since it became due (never negative), or None."""
    since = waiting_since(enqueued_at, eta, due)
    if since is None:
        return None
    return max(0.0, ((now or datetime.now(UTC)) - since).total_seconds())


def _head(raw: str | None) -> tuple[datetime | None, str | None]:
    """When the message at the head of a list became due, and its delivery tag."""
    if raw is None:
        return None, None
    try:
        message = json.loads(raw)
        headers = message.get("headers") or {}
        tag = (message.get("properties") or {}).get("delivery_tag")
    except (ValueError, AttributeError):
        return None, None
    due = waiting_since(headers.get(hdr.ENQUEUED_AT), headers.get("eta"), headers.get(hdr.DUE))
    return due, tag


class BrokerQueues:
    """Reads queue state from the broker's Redis, O(1) commands per queue.

    Keeps, per queue, the delivery tag first seen at its head (for messages without a
    time of their own); one instance per exporter, so that memory spans its scrapes.
    """

    def __init__(
        self,
        client: redis.Redis,
        queues: Sequence[str],
        *,
        priority_steps: Sequence[int] = PRIORITY_STEPS,
        sep: str = PRIORITY_SEP,
        key_prefix: str = "",
        owns_client: bool = False,
        holdings: Holdings | None = None,
    ) -> None:
        self.client = client
        #: close the client with the reader (a client made by ``from_app``)
        self.owns_client = owns_client
        self.queues = list(queues)
        self.priority_steps = sorted(set(priority_steps))
        self.sep = sep
        self.key_prefix = key_prefix
        #: what the transport holds beside the lists (None: not read)
        self.holdings = holdings
        self._seen: dict[str, tuple[str, float]] = {}

    def close(self) -> None:
        if self.owns_client:
            self.client.close()

    def __enter__(self) -> BrokerQueues:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def lists(self, queue: str) -> list[str]:
        """The Redis lists of ``queue``: one per priority step (kombu's names)."""
        return [
            f"{self.key_prefix}{queue}{self.sep}{step}" if step else f"{self.key_prefix}{queue}"
            for step in self.priority_steps
        ]

    def read(self, consumers: Mapping[str, int] | None = None) -> list[QueueState]:
        """Every queue's state: the lists in one round trip, then what the transport
        holds (a few more, whatever the depths)."""
        with self.client.pipeline(transaction=False) as pipe:
            for queue in self.queues:
                for key in self.lists(queue):
                    pipe.llen(key)
                    pipe.lindex(key, -1)
            replies = pipe.execute()
        now, wall = datetime.now(UTC), time.monotonic()
        out, width = [], 2 * len(self.priority_steps)
        for index, queue in enumerate(self.queues):
            chunk = replies[index * width : (index + 1) * width]
            heads = [_decode(raw) for raw in chunk[1::2]]
            state = self._state(queue, sum(int(n) for n in chunk[0::2]), heads, now, wall)
            if consumers is not None:
                state = replace(state, consumers=consumers.get(queue, 0))
            if len(self.priority_steps) > 1:
                dues = [_head(head)[0] for head in heads]
                state = replace(state, levels=levels.read(self.priority_steps, chunk, dues, now))
            out.append(state)
        return out if self.holdings is None else self._with(self.holdings, out)

    def _with(self, holdings: Holdings, states: list[QueueState]) -> list[QueueState]:
        held, clock = holdings(self.client, self.queues)
        out = []
        for state in states:
            mine = held.get(state.queue, Held())
            due_in = None if mine.next_due is None else mine.next_due - clock
            out.append(replace(
                state, delayed=mine.delayed, next_due_in=due_in, in_flight=mine.in_flight,
                in_inboxes=mine.in_inboxes, consumers_alive=mine.consumers_alive,
                clock_skew=mine.clock_skew,
            ))  # fmt: skip
        return out

    def _state(
        self, queue: str, depth: int, heads: list[str | None], now: datetime, wall: float
    ) -> QueueState:
        if depth == 0:
            self._seen.pop(queue, None)
            return QueueState(queue, 0, None, "empty")
        parsed = [_head(raw) for raw in heads if raw is not None]
        dues = [due for due, _ in parsed if due is not None]
        if dues:
            age = max(0.0, (now - min(dues)).total_seconds())
            return QueueState(queue, depth, age, "header")
        tag = next((str(t) for _, t in parsed if t), "")  # the next one to run
        first = self._seen.get(queue)
        if first is None or first[0] != tag or not tag:
            self._seen[queue] = (tag, wall)
            return QueueState(queue, depth, None, "unknown")
        return QueueState(queue, depth, wall - first[1], "seen")


#: why the oldest job's age is unknown on RabbitMQ
AMQP_AGE_NOTE = (
    "RabbitMQ's queue.declare gives no message's age (the management API or a peek "
    "would be needed): not read"
)
NOT_DECLARED = "not-declared"


class Reader(Protocol):
    """What every queue-state reader offers (:class:`BrokerQueues`, :class:`AmqpQueues`)."""

    queues: list[str]

    def read(self, consumers: Mapping[str, int] | None = None) -> list[QueueState]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Reader: ...

    def __exit__(self, *_: object) -> None: ...


def declared(connection: Connection, queue: str) -> tuple[int, int] | None:
    """``(ready messages, consumers)`` of ``queue`` by a passive declare on a channel of
    its own (a missing queue closes the channel), or None when it is not declared."""
    channel = connection.channel()
    try:
        _, depth, consumers = channel.queue_declare(queue=queue, passive=True)
    except connection.channel_errors as exc:  # amqp's NotFound (404) and the like
        if getattr(exc, "code", None) != 404:
            raise
        return None
    finally:
        with contextlib.suppress(Exception):  # the broker closed it already (404)
            channel.close()
    return int(depth), int(consumers)


class AmqpQueues:
    """Reads queue state from RabbitMQ: one passive declare per queue. Depth counts
    the ready messages (not those delivered and unacked); consumers are the broker's."""

    def __init__(self, url: str, queues: Sequence[str], *, timeout: float = 5.0) -> None:
        self.url = url
        self.queues = list(queues)
        self.connection = Connection(url, connect_timeout=timeout)

    def close(self) -> None:
        self.connection.release()

    def __enter__(self) -> AmqpQueues:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def read(self, consumers: Mapping[str, int] | None = None) -> list[QueueState]:
        """Every queue's state (``consumers`` is not needed: the broker counts them)."""
        self.connection.ensure_connection(max_retries=1)
        out = []
        for queue in self.queues:
            found = declared(self.connection, queue)
            if found is None:
                out.append(QueueState(
                    queue, 0, None, NOT_DECLARED, consumers=0,
                    note="the broker has no such queue (not declared yet)",
                ))  # fmt: skip
                continue
            depth, count = found
            source = "empty" if depth == 0 else "unknown"
            note = None if depth == 0 else AMQP_AGE_NOTE
            out.append(QueueState(queue, depth, None, source, consumers=count, note=note))
        return out


def _decode(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def queue_names(app: Any) -> list[str]:
    """Every queue the app declares (``task_queues``, which a layer ``App`` builds from its
    workloads when ``app.amqp`` is first read), else its workloads' queues."""
    getattr(app, "amqp", None)  # a layer App declares its workloads' queues on first read
    declared = app.conf.task_queues or routing.queues_for(routing.workloads(app.conf))
    return sorted({q.name for q in declared})


def from_app(
    app: Any, client: redis.Redis | None = None, holdings: Holdings | None = None
) -> Reader:
    """A reader for the app's broker and queues (Redis, or RabbitMQ through AMQP);
    ``holdings`` reads what the Redis transport holds beside the lists."""
    given = str(app.conf.broker_url or "")
    url = given.split(";", maxsplit=1)[0]
    if is_amqp(url):
        timeout = float(app.conf.get("broker_connection_timeout") or 5.0)
        return AmqpQueues(url, queue_names(app), timeout=timeout)
    if not url.startswith(("redis://", "rediss://", "unix://", *sentinel.SCHEMES)):
        raise ValueError(
            f"queue state is read from a Redis broker (redis://, rediss://, unix://, "
            f"sentinel://) or RabbitMQ (amqp://), not {url.split(':', 1)[0]!r}"
        )
    options = app.conf.broker_transport_options or {}
    owned = client is None
    if client is None:  # on Sentinel, the group's current primary
        client = sentinel.broker_client(given if sentinel.is_sentinel(given) else url, options)
    return BrokerQueues(
        client,
        queue_names(app),
        priority_steps=options.get("priority_steps", PRIORITY_STEPS),
        sep=options.get("sep", PRIORITY_SEP),
        key_prefix=options.get("global_keyprefix", ""),
        owns_client=owned,
        holdings=holdings,
    )


def consumers(app: Any, timeout: float = 1.0) -> dict[str, int]:
    """How many workers consume each queue (a queue no worker named: 0)."""
    replies = app.control.inspect(timeout=timeout).active_queues()
    return count_consumers((replies or {}).values())


def count_consumers(replies: Iterable[Any]) -> dict[str, int]:
    """``active_queues`` replies (one list of queue dicts per worker) -> workers per queue."""
    out: dict[str, int] = {}
    for queues in replies:
        for name in {q.get("name") for q in queues or [] if isinstance(q, dict)}:
            if name:
                out[name] = out.get(name, 0) + 1
    return out
