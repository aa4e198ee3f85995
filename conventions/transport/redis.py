"""kombu's Redis transport with a fetch that cannot lose a message.

kombu's Redis transport fetches with ``BRPOP`` and then, in a second command, records the
message as unacknowledged. Between the two the message lives only in the worker's
memory: a worker killed there (kill -9, OOM killer, a lost machine), or a Redis that
dies with the reply on the wire, loses it for good. kombu 5.7 widens the gap: a reply
that arrives while the worker has no free slot waits in the socket until one frees.

This transport moves each message, in one atomic Redis command, from its queue into an
**inbox** list of the consumer's own (``BLMOVE``), then claims it from the inbox into
kombu's unacked set in one Lua script. At every instant the message is in the queue, in
an inbox or in the unacked set, all inside Redis (and its AOF), never only in a process:

* a consumer says it is alive (``_cc.alive.<consumer>``, good for ``inbox_timeout``
  seconds) and registers its inbox in the same write as each fetch, so both are fresh
  for as long as the fetch can fill the inbox (``inbox_timeout`` must be well above the
  block time: checked when the channel is made);
* every worker's periodic restore (where kombu restores unacked messages past their
  visibility timeout) also moves the messages of dead consumers' inboxes back to the
  head of their queues, and forgets an inbox only once it stayed empty for
  ``inbox_timeout`` (a fetch blocked on it may still fill it);
* the claim and the move back are atomic and exclusive: a consumer that was only slow
  finds its message gone, drops its copy, and the message is delivered once.

A consumer reading one list blocks on it with ``BLMOVE``: no added latency. One reading
several lists (``-Q email,heavy``, or kombu's priority lists) first moves from the first
non-empty one in a single script, and when all are empty blocks on one of them for at
most ``fetch_wait`` seconds (default 0.1) before looking at all again: a message on
another list of an idle worker waits that long at most. ``celeryconfig.py`` sets
``priority_steps`` to ``[0]``, one list per queue, so a one-queue lane blocks for free.

An entry that is not a well-formed kombu message (junk pushed by a foreign producer, or
an envelope with a field of the wrong type) would make kombu raise and stop the worker;
here it is wrapped in a message that the layer's consumer dead-letters as
``unparseable``, with the head of the raw entry kept (:mod:`conventions.transport.envelope`).

A no-ack consumer (``celery inspect``'s replies, ``conventions doctor``, the metrics
exporter) takes its message out of the inbox without a record in the unacked set:
nothing would ever ack it, and it would come back every visibility timeout.

Select it with ``broker_transport = "conventions.transport.redis:Transport"`` (``celeryconfig.py``
does for ``redis://`` and ``rediss://`` URLs). Redis 6.2 or newer (``BLMOVE``).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from queue import Empty
from time import monotonic, time
from typing import Any

from kombu.transport import redis as kredis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps
from redis.exceptions import ResponseError

from conventions.errors import ConfigurationError
from conventions.transport import envelope
from conventions.transport.checks import check_kombu, check_timing
from conventions.transport.envelope import UNPARSEABLE

logger = logging.getLogger("conventions.transport.redis")

#: the hash of every inbox (field) and the queue list it was filled from (value)
INBOXES = "_cc.inboxes"
#: when a sweep first found each inbox of a gone consumer empty (server time, seconds)
DEAD_SINCE = "_cc.inboxes.dead"
INBOX = "_cc.inbox.{consumer}:{source}"
ALIVE = "_cc.alive.{consumer}"
#: seconds a consumer reading several lists blocks on one of them
DEFAULT_FETCH_WAIT = 0.1
#: seconds without a sign of life after which a consumer's inbox is given back
DEFAULT_INBOX_TIMEOUT = 60.0

#: KEYS: sources..., inboxes... -> {index, entry} from the first non-empty source, or nil
SWEEP = """
local n = #KEYS / 2
for i = 1, n do
  local entry = redis.call('LMOVE', KEYS[i], KEYS[n + i], 'RIGHT', 'LEFT')
  if entry then return {i, entry} end
end
return false
"""
#: KEYS: inbox, unacked index, unacked; ARGV: entry, tag, now, record, "1" to record it
#: as unacked ("0": a no-ack consumer's, nothing will ack it) -> 1 claimed, 0 gone
CLAIM = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
end
return 1
"""
#: KEYS: inbox, source, alive, registry, dead-since; ARGV: grace s -> entries given back,
#: or -1 while alive. An inbox is forgotten only once found empty for ``grace`` seconds
#: with its consumer gone: a fetch still under way may yet fill it, and what it puts
#: there is given back by a later sweep (the registry still names the inbox).
GIVE_BACK = """
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HDEL', KEYS[5], KEYS[1])
  return -1
end
local moved = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do moved = moved + 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local since = tonumber(redis.call('HGET', KEYS[5], KEYS[1]))
if moved > 0 or not since then
  redis.call('HSET', KEYS[5], KEYS[1], string.format('%.6f', now))
elseif now - since >= tonumber(ARGV[1]) then
  redis.call('HDEL', KEYS[4], KEYS[1])
  redis.call('HDEL', KEYS[5], KEYS[1])
end
return moved
"""


@dataclass
class PushHook:
    """Pushes one task's message in place of kombu's ``LPUSH``
    (:mod:`conventions.transport.publish`):
    ``push(client, list, body)`` gets the broker connection's client, the Redis list and
    the serialized message."""

    task_id: str
    push: Callable[[Any, str, str], None]
    ran: bool = False


_HOOK: ContextVar[PushHook | None] = ContextVar("conventions_push_hook", default=None)


@contextmanager
def pushing_through(hook: PushHook) -> Iterator[PushHook]:
    """Publish the message of ``hook.task_id`` through ``hook`` within the block."""
    token = _HOOK.set(hook)
    try:
        yield hook
    finally:
        _HOOK.reset(token)


def consumer_of(inbox: str) -> str:
    """The consumer id in an inbox's name."""
    return inbox[len(INBOX.split("{", 1)[0]) :].split(":", 1)[0]


def in_inboxes(client: Any) -> int:
    """How many messages all inboxes hold: fetched, not yet claimed or given back."""
    inboxes = list(client.hkeys(INBOXES))
    if not inboxes:
        return 0
    pipe = client.pipeline(transaction=False)
    for inbox in inboxes:
        pipe.llen(inbox)
    return sum(pipe.execute())


class QoS(kredis.QoS):  # type: ignore[misc]
    """kombu's ack emulation; claimed messages are already in the unacked set, and the
    periodic restore also gives dead consumers' inboxes back."""

    def append(self, message: Any, delivery_tag: str) -> None:
        if self.channel.claimed.pop(delivery_tag, False):
            virtual.QoS.append(self, message, delivery_tag)
        else:  # fetched another way (basic_get), or a message kombu made itself
            super().append(message, delivery_tag)

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        super().restore_visible(start, num, interval)
        if (self._vrestore_count - 1) % (interval or 1) == 0:
            self.channel.give_back_dead_inboxes()


class Channel(kredis.Channel):  # type: ignore[misc]
    """A Redis channel that fetches through an inbox of its own."""

    QoS = QoS
    from_transport_options = (
        *kredis.Channel.from_transport_options,
        "fetch_wait",
        "inbox_timeout",
    )
    fetch_wait = DEFAULT_FETCH_WAIT
    inbox_timeout = DEFAULT_INBOX_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.consumer_id = uuid.uuid4().hex
        self.claimed: dict[str, bool] = {}
        self._inboxes: dict[str, str] = {}
        self._swept_empty = False
        self._turn = 0
        self._sent: tuple[str, list[str]] = ("", [])
        self._sync_client: Any = None
        #: the queues a no-ack consumer reads, by consumer tag
        self._no_ack: dict[str, str] = {}
        super().__init__(*args, **kwargs)
        check_kombu(self)
        check_timing(self.inbox_timeout, self.brpop_timeout, self.fetch_wait)
        self._claim = self.client.register_script(CLAIM)  # EVALSHA, loaded when missing
        if self.global_keyprefix:
            raise ValueError(
                "conventions.transport.redis does not support global_keyprefix: use a Redis "
                "database of the application's own, or kombu's Redis transport"
            )

    def _create_client(self, asynchronous: bool = False) -> Any:
        """One client per channel and pool for the commands outside the event loop.

        kombu builds a new ``redis.Redis`` for every such command (a publish, an ack, an
        event, a claim): about 120 us each with redis-py 8, close to the cost of the
        command itself. A client is thread-safe (each command borrows a connection from
        the pool), so one per pool does the same work; a new pool (after a reconnect)
        gets a new client.
        """
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client

    @property
    def alive_key(self) -> str:
        return ALIVE.format(consumer=self.consumer_id)

    # -- publishing -------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """kombu's push, or the push hook of the task being published (one script)."""
        hook = _HOOK.get()
        headers = message.get("headers") or {}
        if hook is None or headers.get("id") != hook.task_id:
            super()._put(queue, message, **kwargs)
            return
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        with self.conn_or_acquire() as client:
            hook.push(client, key, dumps(message))  # a retried publish runs it again
        hook.ran = True

    # -- fetching ---------------------------------------------------------------------

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        """kombu's, remembering the queues read with ``no_ack``: their messages are not
        recorded as unacked when claimed (kombu only skips its own ``qos.append``)."""
        if no_ack:
            self._no_ack[consumer_tag] = queue
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        self._no_ack.pop(consumer_tag, None)
        return super().basic_cancel(consumer_tag)

    def _brpop_start(self, timeout: float | None = None) -> None:
        # never longer than the block that check_timing weighed inbox_timeout against
        block = min(timeout or self.brpop_timeout, self.brpop_timeout)
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        sources = list(
            dict.fromkeys(self._q_for_pri(q, pri) for pri in self.priority_steps for q in queues)
        )
        for source in sources:
            if source not in self._inboxes:
                self._inboxes[source] = INBOX.format(consumer=self.consumer_id, source=source)
        if len(sources) == 1:
            command = ["BLMOVE", sources[0], self._inboxes[sources[0]], "RIGHT", "LEFT", block]
            self._send("BLMOVE", sources[:1], command)
        elif not self._swept_empty:
            inboxes = [self._inboxes[s] for s in sources]
            self._send("EVAL", sources, ["EVAL", SWEEP, 2 * len(sources), *sources, *inboxes])
        else:
            self._turn = (self._turn + 1) % len(sources)
            source = sources[self._turn]
            wait = min(self.fetch_wait, block)
            command = ["BLMOVE", source, self._inboxes[source], "RIGHT", "LEFT", wait]
            self._send("BLMOVE", [source], command)

    def _send(self, kind: str, sources: list[str], command: list[Any]) -> None:
        """Send the fetch after this consumer's sign of life, in one write on the same
        connection: Redis runs the three back to back, so the alive key (good for
        ``inbox_timeout``, longer than any block) and the inbox's registration are
        fresh whenever a fetch can fill the inbox. ``CLIENT REPLY SKIP`` drops the first
        two replies: the fetch's is the only one to read, no round trip is added."""
        skip = ["CLIENT", "REPLY", "SKIP"]
        alive = ["SET", self.alive_key, 1, "PX", math.ceil(self.inbox_timeout * 1000)]
        register = ["HSET", INBOXES]
        for source in sources:
            register += [self._inboxes[source], source]
        connection = self.client.connection
        self._sent = (kind, sources)
        self._in_poll = connection
        self._brpop_sent_at = monotonic()
        connection.send_packed_command(
            connection.pack_commands([skip, alive, skip, register, command])
        )

    def _brpop_read(self, **options: Any) -> bool:
        kind, sources = self._sent
        try:
            try:
                reply = self.client.parse_response(self.client.connection, kind, **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except ResponseError as exc:
                if "client" not in str(exc).lower():
                    raise
                self.client.connection.disconnect()  # its replies are out of step now
                raise ConfigurationError(
                    "conventions.transport.redis needs CLIENT REPLY on the broker's Redis "
                    f"({exc}): "
                    "allow it to the broker's user (ACL +client|reply), or use kombu's "
                    "Redis transport"
                ) from exc
            if kind == "EVAL":
                self._swept_empty = not reply
                if not reply:
                    raise Empty()
                source, entry = sources[int(reply[0]) - 1], reply[1]
            else:
                self._swept_empty = False
                if reply is None:
                    raise Empty()
                source, entry = sources[0], reply
            queue = source.rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            if not self._claim_and_deliver(self._inboxes[source], entry, queue):
                raise Empty()
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _claim_and_deliver(self, inbox: str, entry: bytes, queue: str) -> bool:
        """Move the entry from the inbox into the unacked set, then hand it to kombu;
        False when a restore gave it back to its queue first (it is delivered there)."""
        payload, tag, exchange, routing_key = envelope.read(
            entry, queue, self.codecs, self.decode_body
        )
        if payload.get("content-type") == UNPARSEABLE:
            facts = payload["properties"].get(envelope.WRAPPED) or {}
            logger.warning(
                "queue %s held an entry kombu cannot take: %s", queue, facts.get("reason")
            )
        acked = queue not in self._no_ack.values()
        record = dumps([payload, exchange, routing_key]) if acked else ""
        keys = [inbox, self.unacked_index_key, self.unacked_key]
        args = [entry, tag, time(), record, "1" if acked else "0"]
        with self.conn_or_acquire() as client:
            if not self._claim(keys=keys, args=args, client=client):
                logger.info("a message fetched from %s was given back before its claim", queue)
                return False
        if acked:
            self.claimed[tag] = True
        self.connection._deliver(payload, queue)
        return True

    # -- liveness and giving back -----------------------------------------------------

    def give_back_dead_inboxes(self) -> int:
        """Move what dead consumers' inboxes hold back to the head of their queues (one
        pipelined script per other consumer's inbox; a live one's is left alone). An
        inbox is forgotten once found empty for ``inbox_timeout``, never at once: a
        fetch of its consumer may still be blocked on it, as after ``close``."""
        with self.conn_or_acquire() as client:
            others = []
            for raw_inbox, raw_source in client.hgetall(INBOXES).items():
                inbox, source = bytes_to_str(raw_inbox), bytes_to_str(raw_source)
                if consumer_of(inbox) != self.consumer_id:
                    others.append((inbox, source))
            if not others:
                return 0
            pipe = client.pipeline(transaction=False)
            for inbox, source in others:
                alive = ALIVE.format(consumer=consumer_of(inbox))
                keys = [inbox, source, alive, INBOXES, DEAD_SINCE]
                pipe.eval(GIVE_BACK, len(keys), *keys, repr(float(self.inbox_timeout)))
            counts = [int(count) for count in pipe.execute()]
        for (_, source), count in zip(others, counts, strict=True):
            if count > 0:
                logger.warning("gave %d message(s) of a dead consumer back to %s", count, source)
        return sum(count for count in counts if count > 0)

    def close(self) -> None:
        """Stop saying this consumer is alive first, so that others give back at once
        what a fetch still in flight may leave in its inbox."""
        if self._inboxes and not self.closed:
            try:
                with self.conn_or_acquire() as client:
                    client.delete(self.alive_key)
            except Exception:  # the broker is gone: the key expires by itself
                logger.debug("could not delete %s", self.alive_key, exc_info=True)
        super().close()


class Transport(kredis.Transport):  # type: ignore[misc]
    """kombu's Redis transport with the inbox fetch."""

    Channel = Channel
