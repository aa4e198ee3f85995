"""Recovery by liveness: a live consumer keeps what it holds fresh, a dead one's is given
back within 5/3 of ``recovery_timeout``.

Every consuming channel of :mod:`conventions.transport.redis` (one that consumes with
acks: never a publisher, never ``celery inspect``'s reply queue) runs a :class:`Keeper`,
a daemon thread (it runs under every pool, the solo pool and Celery's test worker too,
which do not run kombu's event loop) that:

* every ``recovery_timeout / 3`` seconds runs :data:`BEAT`: the consumer's score in
  ``_cc.consumers`` (Redis clock + ``recovery_timeout``), its description, its inboxes'
  registration and the ``unacked_index`` score of every message the process holds
  unacknowledged (Redis clock), all in one script: the sign of life and the in-flight
  set are renewed together. The restore gives a message back once its score is older
  than the visibility timeout *on the Redis clock*, which the channel sets to
  ``recovery_timeout``: a job that runs for hours on a live worker stays fresh, an
  orphan's goes back, whatever any worker's clock says. Each beat also measures this
  process' clock against Redis' (:mod:`conventions.transport.skew`): a warning beyond
  the bound, and the skew in the consumer's description for the exporter;
* about as often, sweeps: :data:`DEAD` finds consumers whose score lapsed (one command
  when nobody died, whatever the size of the fleet); each one's inboxes are given back
  (:data:`GIVE_BACK`, atomic and exclusive, ringing their queues' bells: an idle
  consumer of several queues takes them at once, not at its next timed sweep) and it is
  forgotten once they stayed empty for ``recovery_timeout``; then kombu's restore of
  the unacked set when it has work (it rings the bells too:
  ``Channel._do_restore_message``). A keeper sweeps
  only once it has itself been beating without a failure for one beat period: after an
  outage of Redis every live keeper renews before anyone takes it for dead;
* moves the due messages of its queues' delayed sets
  (:mod:`conventions.transport.delayed`) whose turn (``_cc.mover.<queue>``) it holds or
  finds free, taking it inside the mover's script until its planned wake-up plus
  :attr:`Keeper.turn` seconds; then, holding turns, it sleeps until their sets' next due
  member, at most ``mover_interval`` (10 s), in one ``BLPOP`` on their mover bells
  (``_cc.movebell.<queue>``), which every push into a delayed set rings: a countdown
  published for sooner wakes it at once. A consumer that holds none looks again every
  ``recovery_timeout / 6``. So the fleet moves each queue when something falls due,
  not once a second per consumer; a worker whose slots are all busy still moves; a
  keeper that stops gives its turns up, and one that dies delays its queues' due jobs
  once, by at most the slack (3 s: a push shortens a longer turn to its member's due
  time plus it) plus one look (about 8 s with the defaults); its waits end early for
  its beats and sweeps;
* after each sweep, kombu's restore of the unacked set, only when the sweep's script
  saw a held message older than the visibility timeout (:data:`DEAD_OR_STALE`).

No score, lease or due time here is read from a worker's clock: every comparison is made
inside a script on the Redis server's (``TIME``), so a worker whose clock is minutes off
neither gives back a live worker's jobs nor keeps a dead one's.

Worst case from a consumer's death to its messages being back in their queue:
``recovery_timeout`` (its last score lapses) + one sweep period (``recovery_timeout / 3``)
+ ``unacked_mutex_expire`` when a sweeper died holding kombu's restore mutex (the
profile sets it to ``recovery_timeout / 3``): at most 50 s with the default 30 s.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable
from time import monotonic, time
from typing import Any

from kombu.utils.encoding import bytes_to_str

from conventions.transport import delayed, scripts, skew
from conventions.transport.layout import (
    BELL_CAP,
    BELL_TTL,
    CONSUMER,
    CONSUMERS,
    DEAD_SINCE,
    INBOX,
    INBOXES,
    KEEPER_WAKE,
    MOVER_BELL,
    TURN_SLACK,
    bell_of,
)

logger = logging.getLogger("conventions.transport.liveness")

#: dead consumers one sweep gives back at most
DEAD_PER_SWEEP = 20
#: a mover's turn outlasts its planned wake-up by this many of its intervals, at least
#: ``TURN_MIN`` seconds and at most :data:`~conventions.transport.layout.TURN_SLACK`
#: (:meth:`Keeper.turn`)
TURN_MOVES = 3
TURN_MIN = 1.0
#: seconds a keeper waits before trying Redis again after a failed call
RETRY = 1.0
#: a keeper's waits shorter than this (seconds) are not sent to Redis as a ``BLPOP``
BLOCK_MIN = 0.05
#: the delivery tags this process holds unacknowledged, by the unacked index they are in
#: (server, database and key: a process may consume from more than one broker), each with
#: the number of its claim; on any channel of that index: a channel closed by a
#: reconnect leaves its running jobs' messages here, renewed by the next keeper
HELD: dict[str, dict[str, int]] = {}
_claims = itertools.count(1)


def hold(scope: str, tag: str) -> None:
    """Renew ``tag``'s score in the index ``scope`` from now on (it was just claimed)."""
    HELD.setdefault(scope, {})[tag] = next(_claims)


def release(tag: str) -> None:
    """Stop renewing ``tag`` (acked or rejected)."""
    for held in list(HELD.values()):
        held.pop(tag, None)


#: KEYS: consumers, consumer hash, unacked index, inbox registry; ARGV: consumer,
#: horizon s, queues, host, pid, since, clock skew s ("" unknown), inbox pairs count,
#: pairs..., tags... -> {Redis clock, the tags no longer in the index (acked, or given
#: back): no longer held}. Every score is the Redis clock's, never the worker's.
BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local stamp = string.format('%.6f', now)
redis.call('ZADD', KEYS[1], string.format('%.6f', now + tonumber(ARGV[2])), ARGV[1])
redis.call('HSET', KEYS[2], 'queues', ARGV[3], 'host', ARGV[4], 'pid', ARGV[5],
           'since', ARGV[6], 'skew', ARGV[7], 'beat', stamp)
local i = 9
for _ = 1, tonumber(ARGV[8]) do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local gone = {}
for j = i, #ARGV do
  if redis.call('ZSCORE', KEYS[3], ARGV[j]) then
    redis.call('ZADD', KEYS[3], 'XX', stamp, ARGV[j])
  else
    gone[#gone + 1] = ARGV[j]
  end
end
return {stamp, gone}
"""
#: sent in front of a fetch (KEYS: consumers, inbox registry; ARGV: consumer, horizon s,
#: inbox/source pairs...): alive and the inboxes registered whenever a fetch can fill them
LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], 'GT', string.format('%.6f', now + tonumber(ARGV[2])), ARGV[1])
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return 1
"""
#: KEYS: consumers; ARGV: limit -> ids of consumers whose score lapsed (Redis clock)
DEAD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('ZRANGE', KEYS[1], '-inf', string.format('%.6f', now), 'BYSCORE',
                  'LIMIT', 0, tonumber(ARGV[1]))
"""
#: DEAD, and whether the restore has anything to do. KEYS: consumers, unacked index;
#: ARGV: limit, visibility timeout s -> {1 if a held message's score is older than the
#: visibility timeout (Redis clock), else 0; ids of consumers whose score lapsed}
DEAD_OR_STALE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local dead = redis.call('ZRANGE', KEYS[1], '-inf', string.format('%.6f', now), 'BYSCORE',
                        'LIMIT', 0, tonumber(ARGV[1]))
local ceil = string.format('%.6f', now - tonumber(ARGV[2]))
local stale = redis.call('ZRANGE', KEYS[2], '-inf', ceil, 'BYSCORE', 'LIMIT', 0, 1)
return {#stale, dead}
"""
#: KEYS: consumers, consumer hash, inbox registry, dead-since, inboxes..., bells... (the
#: bell of each inbox's queue, in the same order); ARGV: consumer, grace s, sources...
#: (one per inbox) -> entries given back, -1 if it is alive again. Each message given
#: back rings its queue's bell (an idle consumer of several queues wakes at once, as
#: for a publish). Its inboxes and itself are forgotten once found empty for ``grace``:
#: a fetch still under way may yet fill an inbox, and a later sweep gives that back.
GIVE_BACK = (
    f"""
local bell_cap = {BELL_CAP}
local bell_ttl = {BELL_TTL}
"""
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) > now then
  redis.call('HDEL', KEYS[4], ARGV[1])
  return -1
end
local inboxes = #ARGV - 2
local moved = 0
for i = 1, inboxes do
  local here = 0
  while redis.call('LMOVE', KEYS[4 + i], ARGV[2 + i], 'LEFT', 'RIGHT') do here = here + 1 end
  if here > 0 then
    local bell = KEYS[4 + inboxes + i]
    for _ = 1, math.min(here, bell_cap) do redis.call('LPUSH', bell, '1') end
    redis.call('LTRIM', bell, 0, bell_cap - 1)
    redis.call('EXPIRE', bell, bell_ttl)
  end
  moved = moved + here
end
local since = tonumber(redis.call('HGET', KEYS[4], ARGV[1]))
if moved > 0 or not since then
  redis.call('HSET', KEYS[4], ARGV[1], string.format('%.6f', now))
elseif now - since >= tonumber(ARGV[2]) then
  for i = 1, inboxes do redis.call('HDEL', KEYS[3], KEYS[4 + i]) end
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
  redis.call('HDEL', KEYS[4], ARGV[1])
end
return moved
"""
)


def inbox_prefix(consumer: str) -> str:
    return INBOX.format(consumer=consumer, source="")


def give_back_dead(
    client: Any, own: str, grace: float, limit: int = DEAD_PER_SWEEP, dead: list[Any] | None = None
) -> int:
    """Give back what dead consumers' inboxes hold (one command when nobody died);
    ``own``: this consumer, never taken for dead by itself; ``dead``: the lapsed
    consumers when the caller found them already."""
    if dead is None:
        dead = list(scripts.call(client, DEAD, 1, CONSUMERS, limit))
    dead = [c for c in (bytes_to_str(c) for c in dead) if c != own]
    if not dead:
        return 0
    registry = {bytes_to_str(k): bytes_to_str(v) for k, v in client.hgetall(INBOXES).items()}
    total = 0
    for consumer in dead:
        prefix = inbox_prefix(consumer)
        inboxes = [(i, s) for i, s in registry.items() if i.startswith(prefix)]
        keys = [CONSUMERS, CONSUMER.format(consumer=consumer), INBOXES, DEAD_SINCE,
                *(i for i, _ in inboxes), *(bell_of(s) for _, s in inboxes)]  # fmt: skip
        args = [consumer, repr(float(grace)), *(s for _, s in inboxes)]
        moved = int(scripts.call(client, GIVE_BACK, len(keys), *keys, *args))
        if moved > 0:
            logger.warning("gave %d message(s) of dead consumer %s back", moved, consumer)
            total += moved
    return total


class Keeper(threading.Thread):
    """The daemon thread of one consuming channel (see the module's docstring).

    ``client``: a callable answering a thread-safe Redis client; ``queues``: the queues
    the channel consumes now; ``inboxes``: its inbox -> source registrations;
    ``restore``: kombu's restore of the unacked set past the visibility timeout;
    ``scope``: the unacked index's server, database and key (:data:`HELD`)."""

    def __init__(  # noqa: PLR0917
        self,
        consumer: str,
        client: Callable[[], Any],
        queues: Callable[[], list[str]],
        inboxes: Callable[[], dict[str, str]],
        restore: Callable[[], None],
        unacked_index: str,
        recovery_timeout: float,
        mover_interval: float,
        clock_offset: float = 0.0,
        renew: bool = True,
        scope: str = "",
        wanted: Callable[[], bool] = lambda: True,
        waiting: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(name=f"cc-keeper-{consumer[:8]}", daemon=True)
        self.consumer, self.client, self.queues, self.inboxes = consumer, client, queues, inboxes
        self.restore, self.unacked_index = restore, unacked_index
        self.recovery_timeout, self.mover_interval = recovery_timeout, mover_interval
        self.clock_offset, self.renew, self.scope = clock_offset, renew, scope
        #: False once the channel is closed: the keeper ends (a closed channel's would
        #: keep a consumer alive whose inboxes nobody fills any more)
        self.wanted = wanted
        #: the client of its waits on its bells (``client`` when None): one whose read
        #: timeout outlasts ``mover_interval``
        self.waiting = waiting or client
        self.period = recovery_timeout / 3
        self.stopping = threading.Event()
        self.since = time()
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._mover: Any = None
        #: monotonic time since which every beat succeeded (None: the last one failed)
        self._healthy_since: float | None = None
        self.beats = 0
        self.failures = 0
        #: this process' clock against the Redis server's, measured at each beat
        self.clock = skew.Watch(f"consumer {consumer}")

    def stop(self, wait: float = 2.0) -> None:
        self.stopping.set()
        try:  # end its wait on its bells now
            wake = KEEPER_WAKE.format(consumer=self.consumer)
            self.client().pipeline(transaction=False).lpush(wake, "1").expire(wake, 10).execute()
        except Exception:  # Redis is gone: the wait ends by itself
            logger.debug("keeper of %s: could not wake it", self.consumer, exc_info=True)
        if self.is_alive() and threading.current_thread() is not self:
            self.join(wait)
        try:  # another consumer of these queues moves them at its next look
            delayed.give_up(self.client(), self.queues(), self.consumer)
        except Exception:  # Redis is gone: the turns lapse by themselves
            logger.debug("keeper of %s: could not give up its turns", self.consumer,
                         exc_info=True)  # fmt: skip

    def run(self) -> None:
        next_beat = next_sweep = 0.0
        while not self.stopping.is_set() and self.wanted():
            try:
                pause, bells = self.mover_interval, list[str]()
                now = monotonic()
                if now >= next_beat:
                    self.beat()
                    next_beat = now + self.period
                    if self._healthy_since is None:
                        self._healthy_since = now
                        next_sweep = now + self.period  # let every live keeper renew first
                if now >= next_sweep:
                    self.sweep()
                    next_sweep = now + self.period
                moved = self.move()
                if not moved.turns:  # another consumer moves these queues: look later
                    pause = self.period / 2
                else:  # asleep until the next due member, woken by a push into a set
                    bells = [MOVER_BELL.format(queue=q) for q in moved.held]
                    if moved.next_in is not None:
                        pause = min(pause, max(0.01, moved.next_in))
                if moved.moved >= delayed.MOVE_LIMIT:
                    pause = 0.0  # a backlog: the next batch at once
                pause = min(pause, max(0.0, min(next_beat, next_sweep) - monotonic()))
                self.wait(pause, bells)
                continue
            except Exception as exc:
                if self._healthy_since is not None or not self.failures:
                    logger.warning("keeper of consumer %s: Redis does not answer (%s); "
                                   "renewing again once it does", self.consumer, exc)  # fmt: skip
                self._healthy_since = None
                self.failures += 1
                logger.debug("keeper of %s: Redis call failed", self.consumer, exc_info=True)
                next_beat = 0.0  # renew first once Redis answers again
            self.stopping.wait(min(self.mover_interval, RETRY))

    def wait(self, pause: float, bells: list[str]) -> None:
        """Wait ``pause`` seconds, or until one of ``bells`` rings (a push into a delayed
        set whose turn this keeper holds) or :meth:`stop` rings the keeper's own: one
        ``BLPOP``; without bells, or for a short wait, a wait in this process. Raises
        when Redis does not answer."""
        client = self.waiting()
        pool = getattr(client, "connection_pool", None)
        socket_timeout = pool.connection_kwargs.get("socket_timeout") if pool else None
        # a blocked read must end before the socket's timeout
        pause_on_server = min(pause, float(socket_timeout) - 0.5) if socket_timeout else pause
        if not bells or pause_on_server < BLOCK_MIN or self.stopping.is_set():
            self.stopping.wait(pause)
            return
        client.blpop([*bells, KEEPER_WAKE.format(consumer=self.consumer)],
                     timeout=round(pause_on_server, 3))  # fmt: skip

    def beat(self) -> int:
        """One renewal: alive, described, inboxes registered, held messages fresh;
        answers how many were renewed."""
        pairs = [item for pair in self.inboxes().items() for item in pair]
        mine = HELD.setdefault(self.scope, {})
        held = dict(mine) if self.renew else {}
        keys = [CONSUMERS, CONSUMER.format(consumer=self.consumer), self.unacked_index, INBOXES]
        last = self.clock.skew
        args = [self.consumer, repr(float(self.recovery_timeout)), ",".join(self.queues()),
                self.host, self.pid, repr(self.since), "" if last is None else f"{last:.3f}",
                len(pairs) // 2, *pairs, *held]  # fmt: skip
        sent = time()
        stamp, replied = scripts.call(self.client(), BEAT, len(keys), *keys, *args)
        self.clock.observe(sent, time(), float(stamp))
        gone = [bytes_to_str(t) for t in replied]
        for tag in gone:  # not re-claimed since the snapshot: forget it
            if mine.get(tag) == held.get(tag):
                mine.pop(tag, None)
        self.beats += 1
        return len(held) - len(gone)

    def sweep(self) -> int:
        """Give back dead consumers' inboxes, then kombu's restore of the unacked set."""
        client = self.client()
        if not self.renew:  # the visibility timeout is not this keeper's: kombu's restore
            moved = give_back_dead(client, self.consumer, self.recovery_timeout)
            self.restore()
            return moved
        # the restore (its mutex, the clock, the index: about four commands) only when a
        # held message outlived the visibility timeout, which the channel set to
        # recovery_timeout: asked in the same script as who died
        keys = [CONSUMERS, self.unacked_index]
        stale, dead = scripts.call(client, DEAD_OR_STALE, len(keys), *keys, DEAD_PER_SWEEP,
                                   repr(float(self.recovery_timeout)))  # fmt: skip
        moved = give_back_dead(client, self.consumer, self.recovery_timeout, dead=list(dead))
        if int(stale):
            self.restore()
        return moved

    def move(self) -> delayed.Moved:
        client = self.client()
        if self._mover is None or self._mover.registered_client is not client:
            self._mover = client.register_script(delayed.MOVE)
        return delayed.move(client, self._mover, self.queues(), self.clock_offset,
                            mover=self.consumer, turn=self.turn,
                            wait=self.mover_interval)  # fmt: skip

    @property
    def turn(self) -> float:
        """How long this consumer's turn at moving its queues outlasts its planned
        wake-up (its sets' next due member, or ``mover_interval``): a few of its
        intervals, at least ``TURN_MIN`` and at most ``TURN_SLACK`` seconds, so a busy
        or paused keeper keeps it, and a dead one's lapses within a few seconds of a
        member falling due."""
        return min(max(TURN_MOVES * self.mover_interval, TURN_MIN), TURN_SLACK)
