"""kombu's Redis transport with a fetch that cannot lose a message, delayed delivery
inside Redis and recovery by liveness.

kombu's Redis transport fetches with ``BRPOP`` and then, in a second command, records the
message as unacknowledged. Between the two the message lives only in the worker's
memory: a worker killed there (kill -9, OOM killer, a lost machine), or a Redis that
dies with the reply on the wire, loses it for good. kombu 5.7 widens the gap: a reply
that arrives while the worker has no free slot waits in the socket until one frees.

This transport moves each message, in one atomic Redis command, from its queue into an
**inbox** list of the consumer's own (``BLMOVE``), then claims it from the inbox into
kombu's unacked set in one Lua script. At every instant the message is in the queue, in
an inbox or in the unacked set, all inside Redis (and its AOF), never only in a process:

* a consuming channel runs a keeper (:mod:`conventions.transport.liveness`): its
  consumer's score in ``_cc.consumers`` and the ``unacked_index`` scores of the messages
  it holds are renewed together every third of ``recovery_timeout`` (default 30 s, at
  most 36), and the channel's visibility timeout is that bound: a job runs for hours on
  a live worker and is never delivered twice, while a worker that died whole has its
  unacked messages and its inboxes given back within 5/3 of ``recovery_timeout``;
* a fetch also says the consumer is alive and registers its inbox, in the same write,
  whenever a third of the bound went by, so both are fresh for as long as the fetch can
  fill the inbox (``recovery_timeout`` must be well above the block time: checked when
  the channel is made); a dead consumer is forgotten only once its inboxes stayed empty
  for ``recovery_timeout`` (a fetch blocked on one may still fill it);
* the claim and the move back are atomic and exclusive: a consumer that was only slow
  finds its message gone, drops its copy, and the message is delivered once;
* a finished job's ack goes ahead of the consumer's next fetch, in the same write, when
  one follows at once (:mod:`conventions.transport.acks`): no round trip of its own.

A message whose ``eta`` is still ahead (a countdown, a retry's backoff, a deferral) is
published into its queue's delayed set instead of its list and moved there when due by
every consuming worker (:mod:`conventions.transport.delayed`): no worker holds a message
not yet due, so any delay works, and its due time is in Redis (and its AOF).

A consumer reading one list blocks on it with ``BLMOVE``: no added latency. One reading
several lists (``-Q email,heavy``, or kombu's priority lists) first moves from the first
non-empty one in a single script, and when all are empty blocks on its queues' **bells**
(one ``BLPOP`` over all of them) for ``fetch_wait`` seconds (default 0.1), doubled while
it stays idle up to ``fetch_wait_max`` (default 5, never above the block), before
sweeping all again. Every
publish through this transport (and the one-trip publish's script) rings the queue's
bell in the same command as its push, so the consumer wakes at once and sweeps: the
token is only a hint, the message still moves by the sweep into the inbox, and a
consumer killed between the wake-up and the sweep loses no message. A message that no
bell announced (kombu's own ``LPUSH`` from a foreign producer, a delayed message moved
when due, a dead consumer's given back) is seen by the next sweep, within
``fetch_wait_max``. A busy queue is swept after every message, and an idle worker's
fetch sends two commands every 5 s whatever its number of queues (one, ``BLMOVE``, on
one queue). Without ``polling_interval`` a consuming channel's idle fetch blocks
:data:`IDLE_BLOCK` seconds (at most ``recovery_timeout / 6``) where kombu's blocks 1: a
push wakes a blocked fetch at once, so the block only sets how often an idle consumer
asks (a no-ack one, such as ``inspect``'s reply consumer, keeps kombu's 1 s: it comes
and goes, and a fetch left in flight would take the next call's reply).
``celeryconfig.py`` sets ``priority_steps`` to ``[0]``, one list per queue, so a
one-queue lane blocks for free.

An entry that is not a well-formed kombu message (junk pushed by a foreign producer, or
an envelope with a field of the wrong type) would make kombu raise and stop the worker;
here it is wrapped in a message that the layer's consumer dead-letters as
``unparseable``, with the head of the raw entry kept (:mod:`conventions.transport.envelope`).

A no-ack consumer (``celery inspect``'s replies, ``conventions doctor``, the metrics
exporter) takes its message out of the inbox without a record in the unacked set:
nothing would ever ack it, and it would come back every visibility timeout. It runs no
keeper (a publisher's channel never does either).

Select it with ``broker_transport = "conventions.transport.redis:Transport"`` (``celeryconfig.py``
does for ``redis://`` and ``rediss://`` URLs). Redis 6.2 or newer (``BLMOVE``). On Redis
Sentinel (``sentinel://`` URLs, ``master_name`` in the transport options) the same
transport makes a :class:`SentinelChannel`, which follows the primary across a failover
(:mod:`conventions.transport.sentinel`).

``min_replicas`` (transport option, default 0) makes every publish wait, in the same
round trip, until that many replicas hold it (``WAIT min_replicas replica_wait_ms``):
a publish that fewer replicas confirmed in time raises
:class:`~conventions.errors.BackendUnavailable`, so a job ``.delay()`` answered for
survives a failover.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import uuid
from queue import Empty
from time import monotonic, time
from typing import Any

from kombu.transport import redis as kredis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from conventions.config.sentinel import REPLICA_WAIT_MS, Replicated, replicas_wanted
from conventions.errors import ConfigurationError
from conventions.tracing import headers as hdr
from conventions.transport import acks, delayed, envelope, liveness, priorities, scripts, sentinel
from conventions.transport.checks import check_kombu, check_timing
from conventions.transport.envelope import UNPARSEABLE
from conventions.transport.fetch import (
    CLAIM,
    CLAIM_LARGE,
    CLAIMED,
    DEFERRED,
    PUSH_RING,
    SWEEP,
    refuses_client_reply,
)
from conventions.transport.hook import _HOOK, PushHook, pushing_through
from conventions.transport.layout import (
    BELL,
    BELL_CAP,
    BELL_TTL,
    CONSUMERS,
    INBOX,
    INBOXES,
    MOVER,
    MOVER_BELL,
    bell_of,
    server_now,
)

__all__ = [
    "BELL_CAP", "BELL_TTL", "INBOX", "INBOXES", "UNPARSEABLE", "Channel", "Empty", "PushHook",
    "QoS", "SentinelChannel", "Transport", "bell_of", "consumer_of", "in_inboxes",
    "push_and_ring", "pushing_through",
]  # fmt: skip

logger = logging.getLogger("conventions.transport.redis")

BELL_PREFIX = BELL.split("{", 1)[0]
#: the routing key of Celery's ``task-sent`` event (its type, dots for dashes)
SENT_EVENT = "task.sent"
_PUSH_RING_SHA = hashlib.sha1(PUSH_RING.encode(), usedforsecurity=False).hexdigest()
#: seconds a consumer reading several lists first blocks on one of them (doubled while
#: the consumer stays idle, up to ``fetch_wait_max``)
DEFAULT_FETCH_WAIT = 0.1
DEFAULT_FETCH_WAIT_MAX = 5.0
#: seconds an idle fetch blocks in Redis when ``polling_interval`` is not given (kombu's
#: is 1 s): a push wakes a blocked fetch at once, so the block only sets how many
#: commands an idle consumer sends; at most ``recovery_timeout / IDLE_BLOCK_SHARE``, so
#: the sign of life sent with a fetch always outlasts it
IDLE_BLOCK = 5.0
IDLE_BLOCK_SHARE = 6
#: seconds without a sign of life after which a consumer's messages are given back
DEFAULT_RECOVERY_TIMEOUT = 30.0
#: the longest wait (seconds) between two runs of the mover of a queue's turn holder: it
#: wakes sooner when a member falls due, or at once when a push into the set rings
DEFAULT_MOVER_INTERVAL = 10.0


def consumer_of(inbox: str) -> str:
    """The consumer id in an inbox's name."""
    return inbox[len(INBOX.split("{", 1)[0]) :].split(":", 1)[0]


def push_and_ring(client: Any, source: str, message: str) -> None:
    """kombu's ``LPUSH`` of ``message`` into ``source`` and the ring of its queue's bell,
    in one command (:data:`~conventions.transport.fetch.PUSH_RING`, by its digest; sent
    whole once when the server does not know it yet)."""
    try:
        client.evalsha(_PUSH_RING_SHA, 2, source, bell_of(source), message, BELL_CAP, BELL_TTL)
    except NoScriptError:
        client.eval(PUSH_RING, 2, source, bell_of(source), message, BELL_CAP, BELL_TTL)


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
    """kombu's ack emulation; claimed messages are already in the unacked set, held ones
    are renewed by the channel's keeper, which also runs the restore."""

    def append(self, message: Any, delivery_tag: str) -> None:
        if self.channel.claimed.pop(delivery_tag, False):
            virtual.QoS.append(self, message, delivery_tag)
        else:  # fetched another way (basic_get), or a message kombu made itself
            super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        """kombu's ack, held for the next fetch's write when one follows at once
        (:mod:`conventions.transport.acks`)."""
        liveness.release(delivery_tag)
        channel = self.channel
        if channel.hold_ack(delivery_tag):
            virtual.QoS.ack(self, delivery_tag)
            if not self.can_consume():  # no fetch will follow: send it now
                channel.send_held_acks()
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        liveness.release(delivery_tag)
        super().reject(delivery_tag, requeue=requeue)

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        """kombu's periodic restore; a channel with a keeper leaves it to the keeper
        (which waits for every live consumer to renew after an outage first)."""
        if self.channel.keeper is not None:
            return
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        self.restore_past(num)
        self.channel.give_back_dead_inboxes()

    def restore_now(self) -> None:
        """The restore of the unacked set past the visibility timeout, unthrottled."""
        self.restore_past(self.channel.unacked_restore_limit)

    def restore_past(self, num: int | None) -> int:
        """kombu's restore, on the Redis server's clock: give back the messages whose
        ``unacked_index`` score (written by the claim and the keepers with ``TIME``) is
        older than the visibility timeout *by Redis*, never by this worker's clock
        (kombu compares ``time() - visibility_timeout``: a sweeper 20 s fast gave back
        jobs that live workers were running). Answers how many it gave back."""
        restored = 0
        with self.channel.conn_or_acquire() as client:
            try:
                with kredis.Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    ceil = server_now(client) - self.visibility_timeout
                    visible = client.zrange(self.unacked_index_key, ceil, 0, desc=True,
                                            byscore=True, offset=0 if num else None,
                                            num=num or None)  # fmt: skip
                    for tag in visible or []:
                        self.restore_by_tag(tag, client)
                        restored += 1
            except kredis.MutexHeld:
                pass
        return restored


class Channel(kredis.Channel):  # type: ignore[misc]
    """A Redis channel that fetches through an inbox of its own, keeps its messages not
    yet due in delayed sets, and says it is alive while it consumes."""

    QoS = QoS
    from_transport_options = (
        *kredis.Channel.from_transport_options,
        "fetch_wait",
        "fetch_wait_max",
        "inbox_timeout",
        "recovery_timeout",
        "renew_unacked",
        "mover_interval",
        "clock_offset",
        "min_replicas",
        "replica_wait_ms",
    )
    fetch_wait = DEFAULT_FETCH_WAIT
    #: fetches sent by this channel: its place in the priority steps' weighted cycle
    _fetch_turn = 0
    fetch_wait_max = DEFAULT_FETCH_WAIT_MAX
    #: the former name of ``recovery_timeout``, read when that is not given
    inbox_timeout: float | None = None
    recovery_timeout = DEFAULT_RECOVERY_TIMEOUT
    #: False: held messages are not renewed, the visibility timeout is the recovery
    #: clock again (tests that need a running job delivered twice)
    renew_unacked = True
    mover_interval = DEFAULT_MOVER_INTERVAL
    #: seconds added to the clock due times are compared with (tests only): the Redis
    #: server's in the mover and the claim, this process' when publishing
    clock_offset = 0.0
    #: replicas every publish waits for (0: none) and for how long (milliseconds)
    min_replicas = 0
    replica_wait_ms = REPLICA_WAIT_MS
    #: the keeper class of a consuming channel
    Keeper: type[liveness.Keeper] = liveness.Keeper

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.consumer_id = uuid.uuid4().hex
        self.claimed: dict[str, bool] = {}
        self._inboxes: dict[str, str] = {}
        self._swept_empty = False
        #: the queue whose bell woke the fetch in flight (None: no bell did)
        self._rung: str | None = None
        #: messages taken by a sweep that a bell's wake-up started (read by the tests)
        self.taken_on_ring = 0
        self._wait = DEFAULT_FETCH_WAIT
        self._live_at = -math.inf
        self._sent: tuple[str, list[str]] = ("", [])
        self._sync_client: Any = None
        #: the keeper's client for its waits on its bells, and the pool it was made for
        self._waiting: tuple[Any, Any] = (None, None)
        self._guarded: Any = None
        self.keeper: liveness.Keeper | None = None
        #: the queues a no-ack consumer reads, by consumer tag
        self._no_ack: dict[str, str] = {}
        #: acks held for the next fetch's write, and the thread that sends the fetches
        self._held = acks.Held()
        self._fetch_thread: int | None = None
        super().__init__(*args, **kwargs)
        check_kombu(self)
        options = self.connection.client.transport_options or {}
        if self.inbox_timeout and "recovery_timeout" not in options:
            self.recovery_timeout = float(self.inbox_timeout)
        self.recovery_timeout = float(self.recovery_timeout)
        #: the block of a consuming channel's fetch (one with a keeper: a worker's); a
        #: no-ack one (``inspect``'s replies) keeps kombu's: its short-lived consumers
        #: must not leave a long fetch in flight that takes the next call's reply
        self.idle_block = float(self.brpop_timeout)
        if "polling_interval" not in options and "brpop_timeout" not in options:
            self.idle_block = max(
                self.idle_block, min(IDLE_BLOCK, self.recovery_timeout / IDLE_BLOCK_SHARE)
            )
        check_timing(self.recovery_timeout, self.idle_block, self.fetch_wait,
                     renew=bool(self.renew_unacked))  # fmt: skip
        if self.renew_unacked:  # the keeper renews: the timeout is the recovery bound
            self.visibility_timeout = self.recovery_timeout
        self._wait = float(self.fetch_wait)
        self._replicas = replicas_wanted(
            {"min_replicas": self.min_replicas, "replica_wait_ms": self.replica_wait_ms}
        )
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
        client = self._sync_client
        if client is not None and self._pool is None and getattr(self, "_closing", False):
            # closing after a lost connection: kombu gives back what this channel was
            # delivered through its last client (a new pool would need the released
            # connection's parameters, and raise AttributeError: fatal to the worker)
            return client
        pool = self.pool
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client

    def _waiting_client(self) -> Any:
        """The keeper's client for its waits on its bells (a ``BLPOP`` of up to
        ``mover_interval``): a pool of its own, whose read timeout outlasts the wait by
        the profile's socket timeout (one connection, idle but for that wait)."""
        pool = self.pool
        client, made_for = self._waiting
        if client is None or made_for is not pool:
            if client is not None:
                client.connection_pool.disconnect()
            saved: Any = getattr(self, "socket_timeout", None)
            if saved:
                self.socket_timeout = float(saved) + float(self.mover_interval)
            try:
                client = self.Client(connection_pool=self._get_pool())
            finally:
                self.socket_timeout = saved
            self._waiting = (client, pool)
        return client

    def _publishing_client(self) -> Any:
        """The client a publish goes through: with ``min_replicas``, one whose pushes
        and scripts wait for the replicas in the same round trip (one per pool)."""
        if not self._replicas[0]:
            return self._create_client()
        pool = self.pool
        client = self._guarded
        if client is None or client.connection_pool is not pool:
            client = Replicated(connection_pool=pool).guard(*self._replicas, "broker")
            self._guarded = client
        return client

    @property
    def held_scope(self) -> str:
        """The unacked index this channel's held messages are in: server, database, key."""
        params = self.connection.client
        return f"{params.hostname}:{params.port}/{params.virtual_host}/{self.unacked_index_key}"

    def now(self) -> float:
        """This process' clock, as a publish reads it: a message whose ``eta`` is not
        ahead of it is pushed into its list (the claim still defers it while it is not
        due on the Redis clock)."""
        return time() + float(self.clock_offset)

    # -- publishing -------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """kombu's push, or the push hook of the task being published (one script); a
        message with an ``eta`` still ahead goes to its queue's delayed set instead."""
        hook = _HOOK.get()
        headers = message.get("headers") or {}
        hooked = hook is not None and headers.get("id") == hook.task_id
        due = delayed.due_of(message)
        ready = due is None or due <= self.now()  # one reading of the clock for every choice
        if hdr.DUE in headers and ready:
            # a retry published at once keeps its request's headers: a former due time
            # would make the queues view count its age from then
            message = {**message, "headers": {k: v for k, v in headers.items()
                                              if k != hdr.DUE}}  # fmt: skip
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        if hooked and hook is not None and hook.with_event and ready:
            # kept for the task-sent event Celery publishes next (_put_fanout): one script
            # pushes the message and publishes the event
            hook.pending = self._push_later(hook, key, dumps(message))
            return
        if not hooked and ready:
            # kombu's LPUSH and the queue's bell in one command (with min_replicas, the
            # WAIT in its round trip)
            with self.conn_or_acquire(self._publishing_client()) as client:
                push_and_ring(client, key, dumps(message))
            return
        with self.conn_or_acquire(self._publishing_client()) as client:  # a retry runs it again
            if due is not None and not ready:
                member = delayed.delay(key, message, due)
                if hooked and hook is not None and hook.push_delayed is not None:
                    hook.push_delayed(client, delayed.key_of(queue), due, member)
                else:
                    delayed.push(client, delayed.key_of(queue), due, member)
            elif hook is not None:
                hook.push(client, key, dumps(message), ())
        if hook is not None and hooked:
            hook.ran = True

    def _push_later(self, hook: PushHook, key: str, body: str) -> Any:
        """The push of ``body`` into ``key`` through ``hook``, run on the channel that
        publishes the event (a retry after a lost connection publishes on a revived
        one), else on this one, with the fanout publishes it is given."""

        def pending(channel: Channel | None, events: Any) -> None:
            on = channel or self
            with on.conn_or_acquire(on._publishing_client()) as client:
                hook.push(client, key, body, events)

        return pending

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str,
                    **kwargs: Any) -> None:  # fmt: skip
        """kombu's ``PUBLISH`` of a fanout message; the ``task-sent`` event of a task
        whose push waits for it (:attr:`PushHook.pending`) goes in the push's script."""
        hook = _HOOK.get()
        if (hook is None or hook.pending is None or routing_key != SENT_EVENT
                or kwargs.get("_publish_batch") is not None):  # fmt: skip
            super()._put_fanout(exchange, message, routing_key, **kwargs)
            return
        payload = dumps(message)
        topics = self._get_publish_topics(exchange, routing_key)
        hook.run_pending(self, [(topic, payload) for topic in topics])

    def _do_restore_message(
        self, payload: Any, exchange: Any, routing_key: Any, pipe: Any, leftmost: bool = False
    ) -> None:
        """kombu's restore of a message to its queue (past the visibility timeout, or a
        closing channel's unacked ones), with the ring of the queue's bell in the same
        transaction: an idle consumer of several queues takes it at once, not at its
        next timed sweep. A bell is a hint: a lookup that fails rings none."""
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        try:
            queues = list(dict.fromkeys(self._lookup(exchange, routing_key)))
        except Exception:  # kombu logged why it could not restore it
            return
        for queue in queues:
            bell = bell_of(queue)
            pipe.lpush(bell, "1")
            pipe.ltrim(bell, 0, BELL_CAP - 1)
            pipe.expire(bell, BELL_TTL)

    # -- fetching ---------------------------------------------------------------------

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        """kombu's, remembering the queues read with ``no_ack`` (their messages are not
        recorded as unacked when claimed: kombu only skips its own ``qos.append``); a
        consumer with acks starts the channel's keeper."""
        if no_ack:
            self._no_ack[consumer_tag] = queue
        answer = super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        if not no_ack and self.keeper is None:
            self._start_keeper()
        return answer

    def _start_keeper(self) -> None:
        qos = self.qos
        self.keeper = self.Keeper(
            self.consumer_id,
            client=self._create_client,
            queues=lambda: [q for q in list(self.active_queues)
                            if q not in self._no_ack.values()],
            inboxes=lambda: {inbox: source for source, inbox in list(self._inboxes.items())},
            restore=qos.restore_now,
            unacked_index=self.unacked_index_key,
            recovery_timeout=self.recovery_timeout,
            mover_interval=float(self.mover_interval),
            clock_offset=float(self.clock_offset),
            renew=bool(self.renew_unacked),
            scope=self.held_scope,
            wanted=lambda: not self.closed,
            waiting=self._waiting_client,
        )  # fmt: skip
        self.keeper.start()

    def basic_cancel(self, consumer_tag: str) -> Any:
        self._no_ack.pop(consumer_tag, None)
        self._send_held_acks_or_warn()  # its fetches may stop
        return super().basic_cancel(consumer_tag)

    def hold_ack(self, tag: str) -> bool:
        """Hold ``tag``'s ack for the next fetch's write when one follows at once: this
        channel consumes, no fetch is in flight, and the ack is made on the thread that
        sends the fetches (:mod:`conventions.transport.acks`)."""
        if (
            self.keeper is None
            or self._in_poll
            or not self.active_queues
            or self._fetch_thread != threading.get_ident()
        ):
            return False
        return self._held.hold(tag)

    def send_held_acks(self) -> None:
        """Send the held acks on their own (one transaction, as kombu's ack)."""
        if not len(self._held):
            return
        tags = self._held.take()
        with self.conn_or_acquire() as client:
            client.pipeline().zrem(self.unacked_index_key, *tags).hdel(
                self.unacked_key, *tags
            ).execute()

    def _send_held_acks_or_warn(self) -> None:
        """:meth:`send_held_acks` where no fetch follows (a cancel, a close): a broker
        that is gone is logged, not raised into kombu's teardown; the messages stay
        unacked and come back, their keys done (:mod:`conventions.transport.acks`)."""
        held = len(self._held)
        try:
            self.send_held_acks()
        except Exception:
            logger.warning("could not send %d held acks", held, exc_info=True)

    def _brpop_start(self, timeout: float | None = None) -> None:
        # never longer than the block that check_timing weighed recovery_timeout against
        longest = self.idle_block if self.keeper is not None else self.brpop_timeout
        block = min(timeout or longest, longest)
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            self._send_held_acks_or_warn()
            return
        # weighted, never strict: a lower priority step is looked at first on some
        # fetches, so a flood of higher ones cannot starve it (conventions.transport.priorities)
        steps = priorities.fetch_order(self.priority_steps, self._fetch_turn)
        self._fetch_turn += 1
        sources = list(dict.fromkeys(self._q_for_pri(q, pri) for pri in steps for q in queues))
        fresh = False
        for source in sources:
            if source not in self._inboxes:
                self._inboxes[source] = INBOX.format(consumer=self.consumer_id, source=source)
                fresh = True
        if len(sources) == 1:
            command = ["BLMOVE", sources[0], self._inboxes[sources[0]], "RIGHT", "LEFT", block]
            self._send("BLMOVE", sources[:1], command, fresh)
        elif not self._swept_empty:
            inboxes = [self._inboxes[s] for s in sources]
            bells = list(dict.fromkeys(bell_of(s) for s in sources))
            command = ["EVALSHA", scripts.sha_of(SWEEP), 2 * len(sources) + len(bells),
                       *sources, *inboxes, *bells, len(sources)]  # fmt: skip
            self._send("EVAL", sources, command, fresh)
        else:  # all empty: wait on their bells, then sweep again (woken or not)
            wait = min(self._wait, block)
            self._wait = min(self._wait * 2, max(float(self.fetch_wait_max), self.fetch_wait))
            command = ["BLPOP", *dict.fromkeys(bell_of(s) for s in sources), wait]
            self._send("BLPOP", sources, command, fresh)

    def _send(self, kind: str, sources: list[str], command: list[Any], fresh: bool) -> None:
        """Send the fetch, after this consumer's sign of life when it is due, in one
        write on the same connection: Redis runs them back to back, so the consumer's
        liveness (good for ``recovery_timeout``, renewed here at least every third of it,
        and longer than any block) and the inbox's registration are fresh whenever a
        fetch can fill the inbox. ``CLIENT REPLY SKIP`` drops the script's reply: the
        fetch's is the only one to read, no round trip is added."""
        held = self._held.commands(self.unacked_index_key, self.unacked_key)
        commands = list(held)
        now = monotonic()
        if fresh or now - self._live_at >= self.recovery_timeout / 3:
            pairs = [item for s in sources for item in (self._inboxes[s], s)]
            commands += [["CLIENT", "REPLY", "SKIP"],
                         ["EVAL", liveness.LIVE, 2, CONSUMERS, INBOXES, self.consumer_id,
                          repr(self.recovery_timeout), *pairs]]  # fmt: skip
            self._live_at = now
        connection = self.client.connection
        self._sent = (kind, sources)
        self._in_poll = connection
        self._brpop_sent_at = now
        self._fetch_thread = threading.get_ident()
        try:
            connection.send_packed_command(connection.pack_commands([*commands, command]))
        except BaseException:
            self._in_poll = None  # nothing is in flight: the next poll sends again
            self._live_at = -math.inf
            raise
        if held:  # written: Redis runs them before the fetch
            self._held.take()

    def _brpop_read(self, **options: Any) -> bool:
        connection = self.client.connection
        if not self._reply_ready(connection):
            # woken with nothing to read: the event loop saw another socket on a
            # descriptor number this fetch's socket once had, or this socket was closed
            # earlier in the same tick. A blocking read would wait the socket timeout and
            # call a live connection lost; the fetch stays in flight (or is sent again)
            raise Empty()
        kind, sources = self._sent
        try:
            try:
                reply = self.client.parse_response(connection, kind, **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                self._live_at = -math.inf  # a new connection: say it again
                raise
            except NoScriptError:
                # the server lost the sweep (a restart, a failover, SCRIPT FLUSH): it ran
                # nothing, and its reply was the only one due; load it, sweep again
                self._swept_empty = False
                self.client.script_load(SWEEP)
                raise Empty() from None
            except ResponseError as exc:
                # an error reply to the fetch or to what was sent with it: the replies
                # still due on this connection are out of step, so it is dropped, and the
                # error is one the worker reconnects from (kombu re-sends the fetch)
                self.client.connection.disconnect()
                self._live_at = -math.inf
                if not refuses_client_reply(exc):
                    raise RedisConnectionError(f"the fetch got an error reply: {exc}") from exc
                raise ConfigurationError(
                    "conventions.transport.redis needs CLIENT REPLY on the broker's Redis "
                    f"({exc}): "
                    "allow it to the broker's user (ACL +client|reply), or use kombu's "
                    "Redis transport"
                ) from exc
            # read: nothing is in flight, so an ack made while it is delivered may be held
            rung, self._rung, self._in_poll = self._rung, None, None
            if kind == "BLPOP":  # a bell rang, or the wait ran out: sweep next
                self._swept_empty = False
                if reply is not None:
                    self._rung = bytes_to_str(reply[0])[len(BELL_PREFIX) :]
                raise Empty()
            if kind == "EVAL":
                self._swept_empty = not reply
                if not reply:
                    raise Empty()
                source, entry = sources[int(reply[0]) - 1], reply[1]
                if rung is not None:
                    self.taken_on_ring += 1
                    logger.debug("a bell of %s woke the fetch that took a message from %s",
                                 rung, source)  # fmt: skip
            else:
                self._swept_empty = False
                if reply is None:
                    raise Empty()
                source, entry = sources[0], reply
            self._wait = float(self.fetch_wait)
            queue = source.rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            if not self._claim_and_deliver(self._inboxes[source], entry, queue, source):
                raise Empty()
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _reply_ready(self, connection: Any) -> bool:
        """Whether the fetch in flight on ``connection`` has (part of) its reply to read,
        without blocking; a connection the server closed reads as ready (the read then
        raises the connection error the worker reconnects from)."""
        if connection is None or self._in_poll is not connection:
            return False
        if getattr(connection, "_sock", None) is None:
            self._in_poll = None  # closed: nothing is in flight, the next poll sends again
            return False
        try:
            return bool(connection.can_read(timeout=0))
        except self.connection_errors:
            return True

    @property
    def max_message_bytes(self) -> int:
        """The largest entry this channel decodes (transport option ``max_message_bytes``,
        which the layer's worker sets from ``conventions_max_message_bytes``)."""
        options = self.connection.client.transport_options or {}
        return int(options.get("max_message_bytes") or envelope.MAX_ENTRY)

    def _claim_and_deliver(self, inbox: str, entry: bytes, queue: str, source: str) -> bool:
        """Move the entry from the inbox into the unacked set (scored on the Redis clock),
        then hand it to kombu; False when a restore gave it back to its queue first (it
        is delivered there), or when it is not due yet on the Redis clock (it went to the
        delayed set). An entry over the size cap is weighed before it is decoded and
        handed on wrapped, for its dead letter."""
        limit = self.max_message_bytes
        payload, tag, exchange, routing_key = envelope.read(
            entry, queue, self.codecs, self.decode_body, limit
        )
        if payload.get("content-type") == UNPARSEABLE:
            facts = payload["properties"].get(envelope.WRAPPED) or {}
            logger.warning(
                "queue %s held an entry kombu cannot take: %s", queue, facts.get("reason")
            )
        due = delayed.due_of(payload)
        member = ""
        if due is not None:  # delivered without its eta: the worker's clock never holds it
            member = delayed.delay(source, payload, due)
            payload = delayed.undelayed(payload, due)
        tag = envelope.own_tag(payload)  # never the producer's: one record per message
        acked = queue not in self._no_ack.values()
        record = dumps([payload, exchange, routing_key]) if acked else ""
        keys = [inbox, self.unacked_index_key, self.unacked_key, delayed.key_of(queue),
                MOVER.format(queue=queue), MOVER_BELL.format(queue=queue)]  # fmt: skip
        args = [entry, tag, record, "1" if acked else "0", "" if due is None else repr(due),
                member, repr(float(self.clock_offset))]  # fmt: skip
        claim = self._claim
        if len(entry) > limit:  # named by its size and digest, not sent back whole
            claim = self.client.register_script(CLAIM_LARGE)
            digest = hashlib.sha1(entry, usedforsecurity=False).hexdigest()
            args = [len(entry), digest, *args[1:4]]
        with self.conn_or_acquire() as client:
            answer = int(claim(keys=keys, args=args, client=client))
        if answer == DEFERRED:  # not yet due on the Redis clock: it waits in Redis
            return False
        if answer != CLAIMED:
            logger.info("a message fetched from %s was given back before its claim", queue)
            return False
        if acked:
            self.claimed[tag] = True
            liveness.hold(self.held_scope, tag)
        self.connection._deliver(payload, queue)
        return True

    # -- liveness and giving back -----------------------------------------------------

    def give_back_dead_inboxes(self) -> int:
        """Move what dead consumers' inboxes hold back to the head of their queues (a
        live one's is left alone; one command when nobody died). A dead consumer is
        forgotten once its inboxes stayed empty for ``recovery_timeout``, never at once:
        a fetch of its may still be blocked on one, as after ``close``."""
        with self.conn_or_acquire() as client:
            return liveness.give_back_dead(client, self.consumer_id, self.recovery_timeout)

    def close(self) -> None:
        """Stop the keeper and say this consumer is gone first, so that others give
        back at once what a fetch still in flight may leave in its inbox."""
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            keeper.stop()
        self._send_held_acks_or_warn()
        if (self._inboxes or keeper is not None) and not self.closed:
            try:
                with self.conn_or_acquire() as client:
                    client.zadd(CONSUMERS, {self.consumer_id: 0})
            except Exception:  # the broker is gone: its score lapses by itself
                logger.debug("could not retire consumer %s", self.consumer_id, exc_info=True)
        waiting, self._waiting = self._waiting[0], (None, None)
        if waiting is not None:
            waiting.connection_pool.disconnect()
        super().close()


class SentinelChannel(Channel, kredis.SentinelChannel):  # type: ignore[misc]
    """The layer's channel on the current primary of a Sentinel group: kombu's
    ``SentinelChannel`` makes its pools, the layer's the fetch, delayed sets and
    keeper, which holds its sweeps after a failover
    (:class:`~conventions.transport.sentinel.FollowingKeeper`)."""

    from_transport_options = tuple(
        dict.fromkeys((*Channel.from_transport_options, *sentinel.SENTINEL_OPTIONS))
    )
    Keeper = sentinel.FollowingKeeper

    @property
    def held_scope(self) -> str:
        """The group, not a server: the held messages stay this process' across a
        failover, renewed on the new primary."""
        params = self.connection.client
        return f"sentinel:{self.master_name}/{params.virtual_host}/{self.unacked_index_key}"


class Transport(kredis.Transport):  # type: ignore[misc]
    """kombu's Redis transport with the inbox fetch, delayed sets and liveness; its
    channels are :class:`SentinelChannel` on a Sentinel connection."""

    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        if sentinel.wanted(client):
            self.Channel = SentinelChannel
            # never switch to the "next" URL: each names a sentinel, and every channel
            # asks them all; kombu's switch would re-read the URL's scheme and reconnect
            # through its stock SentinelTransport, without the inbox fetch or the WAIT
            client.cycle = None
