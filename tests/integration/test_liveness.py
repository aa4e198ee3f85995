"""Recovery by liveness (``conventions.transport.liveness``) on a real Redis: a live
consumer's held messages stay fresh however long it holds them, a dead one's come back
within the bound, a give-back is exclusive, and a sweep costs one command when nobody
died, whatever the number of consumers.

Command counts are read from a Redis server of the test's own (``INFO commandstats``):
the machine's Redis is shared with other tests.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Queue

from conventions.config.profile import INBOX_TRANSPORT
from conventions.transport import layout, liveness
from conventions.transport.layout import CONSUMER, CONSUMERS, INBOX, INBOXES
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.fixtures import unavailable
from tests.integration.helpers import SpareRedis, wait_for
from tests.integration.test_broker import publish

pytestmark = [pytest.mark.usefixtures("services"), pytest.mark.timeout(60)]

URL = f"{REDIS_BASE}/{BROKER_DB}"
#: a bound of 3 s: beats every second
OPTIONS = {"priority_steps": [0], "recovery_timeout": 3, "polling_interval": 1}


@pytest.fixture
def queue() -> Queue:
    name = f"liveness-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    with redis.Redis.from_url(URL) as c:
        yield c


class Holder:
    """A consumer that takes one message and never acks it (a job running long)."""

    def __init__(self, queue: Queue) -> None:
        self.connection = Connection(URL, transport=INBOX_TRANSPORT, transport_options=OPTIONS)
        self.channel = self.connection.channel()
        self.got: list[Any] = []
        self.consumer = Consumer(self.channel, [queue], on_message=self.got.append)
        self.consumer.consume()

    def take(self) -> str:
        deadline = time.monotonic() + 10
        while not self.got and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                self.connection.drain_events(timeout=0.5)
        assert self.got, "no message came"
        return str(self.got[0].delivery_tag)

    def die(self) -> None:
        """What kill -9 does to it: the keeper stops, nothing is given back by it."""
        assert self.channel.keeper is not None
        self.channel.keeper.stop()
        self.channel.keeper = None
        self.channel.qos._delivered.clear()  # nothing restored by its close
        for tag in list(liveness.HELD.get(self.channel.held_scope, {})):
            liveness.release(tag)

    def close(self) -> None:
        self.channel.qos._delivered.clear()
        self.connection.release()


@pytest.fixture
def holder(queue: Queue) -> Iterator[Holder]:
    made = Holder(queue)
    yield made
    made.close()


@pytest.fixture
def sweeper() -> Iterator[Any]:
    with Connection(URL, transport=INBOX_TRANSPORT, transport_options=OPTIONS) as own:
        yield own.channel()


def test_a_live_consumer_keeps_its_held_message_however_long_it_holds_it(
    holder: Holder, queue: Queue, client: redis.Redis, sweeper: Any
) -> None:
    publish(holder.connection, queue, {"n": 1})
    tag = holder.take()
    time.sleep(OPTIONS["recovery_timeout"] * 2.5)  # far past the visibility timeout
    sweeper.qos.restore_now()
    assert client.llen(queue.name) == 0  # not given back: its keeper renewed it
    assert client.hexists(sweeper.unacked_key, tag)
    assert time.time() - (client.zscore(sweeper.unacked_index_key, tag) or 0) < 1.5
    alive = layout.consumers_alive(client)
    assert alive.get(queue.name) == 1
    described = client.hgetall(CONSUMER.format(consumer=holder.channel.consumer_id))
    assert described[b"queues"] == queue.name.encode() and described[b"pid"]


def test_a_dead_consumers_held_message_goes_back_within_the_bound(
    holder: Holder, queue: Queue, client: redis.Redis, sweeper: Any
) -> None:
    publish(holder.connection, queue, {"n": 1})
    tag = holder.take()
    holder.die()
    died = time.monotonic()

    def back() -> bool:
        sweeper.qos.restore_now()  # what every live keeper runs every third of the bound
        return client.llen(queue.name) == 1

    wait_for(back, timeout=10, every=0.2)
    waited = time.monotonic() - died
    print(f"\nheld message back {waited:.1f}s after its consumer died (bound 3 s + a sweep)")
    assert waited >= OPTIONS["recovery_timeout"] - 1.5  # never while it could be alive
    assert not client.hexists(sweeper.unacked_key, tag)


def test_a_dead_consumers_inboxes_are_given_back_once_by_concurrent_sweepers(
    client: redis.Redis, queue: Queue
) -> None:
    consumer = uuid.uuid4().hex
    inbox = INBOX.format(consumer=consumer, source=queue.name)
    client.zadd(CONSUMERS, {consumer: 1})  # long dead
    client.hset(INBOXES, inbox, queue.name)
    client.lpush(inbox, *[f"m{n}" for n in range(50)])
    moved: list[int] = []

    def sweep() -> None:
        with redis.Redis.from_url(URL) as own:
            moved.append(liveness.give_back_dead(own, "another", grace=30))

    threads = [threading.Thread(target=sweep) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(moved) == 50 and client.llen(queue.name) == 50
    assert sorted(client.lrange(queue.name, 0, -1)) == sorted(f"m{n}".encode() for n in range(50))
    # the oldest entry (fetched first) is at the head of the queue: delivered first
    assert client.lindex(queue.name, -1) == b"m0"
    client.delete(queue.name)


def test_what_a_dead_consumers_inboxes_give_back_rings_their_queues_bells(
    client: redis.Redis, queue: Queue
) -> None:
    """An idle consumer of several queues waits on their bells: a job given back must
    ring, as a publish does, or it waits for the consumer's next timed sweep."""
    consumer = uuid.uuid4().hex
    other = f"{queue.name}-b"
    inboxes = {INBOX.format(consumer=consumer, source=s): s for s in (queue.name, other)}
    client.zadd(CONSUMERS, {consumer: 1})  # long dead
    for inbox, source in inboxes.items():
        client.hset(INBOXES, inbox, source)
    first = next(iter(inboxes))
    client.lpush(first, "m0", "m1")  # the other inbox is empty: its bell stays silent
    assert liveness.give_back_dead(client, "another", grace=30) == 2
    bell = layout.bell_of(queue.name)
    assert (client.llen(bell), 0 < client.ttl(bell) <= layout.BELL_TTL) == (2, True)
    assert not client.exists(layout.bell_of(other))
    client.delete(queue.name, bell)


def test_a_message_restored_past_the_visibility_timeout_rings_its_queues_bell(
    holder: Holder, queue: Queue, client: redis.Redis, sweeper: Any
) -> None:
    publish(holder.connection, queue, {"n": 1})
    tag = holder.take()
    bell = layout.bell_of(queue.name)
    client.delete(bell)  # the publish's ring
    holder.die()
    sweeper.qos.restore_by_tag(tag)  # what the restore past the timeout does with it
    assert client.llen(queue.name) == 1
    assert (client.llen(bell), 0 < client.ttl(bell) <= layout.BELL_TTL) == (1, True)
    client.delete(queue.name, bell)


def test_a_dead_consumer_is_forgotten_once_its_inboxes_stayed_empty(
    client: redis.Redis, queue: Queue
) -> None:
    consumer = uuid.uuid4().hex
    inbox = INBOX.format(consumer=consumer, source=queue.name)
    client.zadd(CONSUMERS, {consumer: 1})
    client.hset(INBOXES, inbox, queue.name)
    client.hset(CONSUMER.format(consumer=consumer), "queues", queue.name)
    assert liveness.give_back_dead(client, "another", grace=0.3) == 0
    assert client.zscore(CONSUMERS, consumer) is not None  # a fetch may still fill it
    time.sleep(0.4)
    liveness.give_back_dead(client, "another", grace=0.3)
    assert client.zscore(CONSUMERS, consumer) is None
    assert not client.hexists(INBOXES, inbox)
    assert not client.exists(CONSUMER.format(consumer=consumer))


def test_a_consumer_alive_again_is_left_alone(client: redis.Redis, queue: Queue) -> None:
    consumer = uuid.uuid4().hex
    inbox = INBOX.format(consumer=consumer, source=queue.name)
    client.zadd(CONSUMERS, {consumer: layout.server_now(client) + 30})
    client.hset(INBOXES, inbox, queue.name)
    client.lpush(inbox, "m")
    script = liveness.GIVE_BACK
    keys = [CONSUMERS, CONSUMER.format(consumer=consumer), INBOXES, liveness.DEAD_SINCE, inbox,
            layout.bell_of(queue.name)]  # fmt: skip
    assert client.eval(script, len(keys), *keys, consumer, "30", queue.name) == -1
    assert client.llen(inbox) == 1
    client.delete(inbox)
    client.zrem(CONSUMERS, consumer)
    client.hdel(INBOXES, inbox)


# -- the cost of a sweep and of an idle consumer, on a Redis of the test's own -----------


@pytest.fixture
def own_redis() -> Iterator[SpareRedis]:
    if shutil.which("redis-server") is None:
        unavailable("redis-server (a Redis of the test's own)", FileNotFoundError())
    server = SpareRedis()
    server.start()
    yield server
    server.stop()


#: commands only the transport's scripts call here: a script counts once, as its EVAL
#: (``get``/``set``: the mover's turn, in its script; an idle consumer sends neither)
INNER = {"zrange", "lmove", "time", "hset", "zadd", "zrem", "lpush", "hget", "hdel", "zscore",
         "lrem", "del", "zcard", "get", "set"}  # fmt: skip


def calls(client: redis.Redis) -> int:
    """Commands clients sent so far (one ``INFO``: this one)."""
    stats = client.info("commandstats")
    return sum(int(stat["calls"]) for name, stat in stats.items()
               if name.removeprefix("cmdstat_") not in INNER)  # fmt: skip


@pytest.mark.parametrize("fleet", [1, 10, 50])
def test_a_sweep_when_nobody_died_is_one_command_whatever_the_fleet(
    own_redis: SpareRedis, fleet: int
) -> None:
    with redis.Redis(port=own_redis.port) as client:
        now = layout.server_now(client)
        client.zadd(CONSUMERS, {uuid.uuid4().hex: now + 30 for _ in range(fleet)})
        for consumer in client.zrange(CONSUMERS, 0, -1):
            inbox = INBOX.format(consumer=consumer.decode(), source="email")
            client.hset(INBOXES, inbox, "email")
        liveness.give_back_dead(client, "me", grace=30)  # the script sent whole, once
        before = calls(client)
        assert liveness.give_back_dead(client, "me", grace=30) == 0
        assert calls(client) - before - 1 == 1  # the INFO of ``before`` is the other one


def test_an_idle_consumer_of_two_queues_sends_a_few_commands_a_second(
    own_redis: SpareRedis,
) -> None:
    url = f"redis://127.0.0.1:{own_redis.port}/0"
    queues = [Queue(n, Exchange(n, type="direct"), routing_key=n) for n in ("email", "heavy")]
    options = {"priority_steps": [0]}
    with (
        redis.Redis(port=own_redis.port) as client,
        Connection(url, transport=INBOX_TRANSPORT, transport_options=options) as connection,
        Consumer(connection, queues, on_message=lambda message: None),
    ):
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:  # warm up: the fetch wait grows
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.5)
        before, started = calls(client), time.monotonic()
        while time.monotonic() - started < 5:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.5)
        rate = (calls(client) - before - 1) / (time.monotonic() - started)
    print(f"\nidle consumer of 2 queues: {rate:.1f} commands/s")
    assert rate < 5


def test_after_an_outage_a_keeper_renews_first_and_sweeps_only_a_beat_period_later(
    own_redis: SpareRedis,
) -> None:
    """Every live keeper renews before anyone sweeps: a sweep right after Redis came back
    would take the running jobs of keepers not yet renewed for orphans."""
    sweeps: list[float] = []
    with redis.Redis(port=own_redis.port, socket_timeout=1, socket_connect_timeout=1) as client:
        keeper = liveness.Keeper(
            uuid.uuid4().hex, client=lambda: client, queues=lambda: ["email"],
            inboxes=lambda: {}, restore=lambda: sweeps.append(time.monotonic()),
            unacked_index="unacked_index", recovery_timeout=3.0, mover_interval=0.1,
            renew=False,  # kombu's restore at every sweep: the sweeps' clock here
        )  # fmt: skip
        keeper.start()
        try:
            wait_for(lambda: bool(sweeps), timeout=5, every=0.05)  # a first sweep, a beat in
            own_redis.stop()
            wait_for(lambda: keeper.failures > 0, timeout=5, every=0.05)
            own_redis.start()
            beats = keeper.beats
            wait_for(lambda: keeper.beats > beats, timeout=5, every=0.02)
            renewed = time.monotonic()
            count = len(sweeps)
            wait_for(lambda: len(sweeps) > count, timeout=5, every=0.02)
            assert sweeps[-1] - renewed >= keeper.period - 0.2  # a whole beat period after
        finally:
            keeper.stop()
