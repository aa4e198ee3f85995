"""What an idle worker and the fleet's sweeps cost Redis: commands, not seconds.

Every figure is counted on a ``redis-server`` of this section's own (``INFO
commandstats``, so no other client's commands mix in; a command a script calls counts
once, as its ``EVAL``):

* **idle commands/s** of one consumer (kombu, prefetch 1, nothing to fetch) reading 1, 2
  and 5 queues, on the layer's transport (fetch, keeper, mover, sweeps) and on kombu's
  own (``BRPOP``);
* **per worker, for a fleet** of 1, 10 and 50 simulated consumers: each runs a real
  :class:`~conventions.transport.liveness.Keeper` (beats, sweeps, mover) in this process;
  the fleet's commands/s divided by its size must not grow with it;
* **wake-up latency** of an idle consumer of 1, 2 and 5 queues: 100 trials each, every
  one from an idle state (the fetch's back-off at its longest, plus a random part of it),
  published to a queue other than the one it last took from; p50 and p99 from the
  publish to the message's delivery in the consumer (kombu's ``BRPOP`` beside it);
* **one sweep** (the dead-inbox give-back) when nobody died: commands per call for 1,
  10, 50 registered consumers, against the former design's (one script per inbox of
  every other consumer: grows with the fleet, so the fleet's load with its square).
"""

from __future__ import annotations

import contextlib
import queue as queues_
import random
import shutil
import socket
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from bench.report import Report, Row
from conventions.transport import liveness
from conventions.transport.layout import CONSUMERS, INBOX, INBOXES
from conventions.transport.redis import DEFAULT_MOVER_INTERVAL

#: commands only scripts call in these runs: counted once, as the script's EVAL
INNER = {"zrange", "lmove", "time", "hset", "zadd", "zrem", "lpush", "hget", "hdel",
         "zscore", "lrem", "zcard", "del", "ltrim", "get", "set", "pexpire", "pttl",
         "expire"}  # fmt: skip
FLEETS = (1, 10, 50)
#: the fetch's longest back-off (the transport's default ``fetch_wait_max``), seconds
BACKOFF_MAX = 1.0
TRIALS = 100
SEED = 32


@contextlib.contextmanager
def own_redis(
    wrap: Sequence[str] = (), args: Sequence[str] = (), timeout: float = 10, **client: Any
) -> Iterator[redis.Redis]:
    """A throwaway ``redis-server`` on a free port. ``wrap``: a command it runs under
    (``valgrind ...``; ``{port}`` in it is the server's port), ``args``: more of its
    options, ``timeout``: how long it may take to answer, ``client``: the client's options.
    The server's pid (under ``wrap`` too) is its ``INFO server`` ``process_id``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    proc = subprocess.Popen(
        [*(part.replace("{port}", str(port)) for part in wrap),
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if wrap else None,  # valgrind's
    )  # fmt: skip
    connection = redis.Redis(port=port, **client)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                connection.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield connection
    finally:
        connection.close()
        proc.terminate()
        proc.wait(max(10, timeout))


def calls(client: redis.Redis) -> int:
    """Commands clients sent so far (this ``INFO`` included)."""
    stats = client.info("commandstats")
    return sum(int(s["calls"]) for name, s in stats.items()
               if name.removeprefix("cmdstat_") not in INNER)  # fmt: skip


def rate(client: redis.Redis, seconds: float, tick: Any = None) -> float:
    """Commands/s clients sent over ``seconds`` (``tick``: called meanwhile)."""
    before, started = calls(client), time.monotonic()
    while time.monotonic() - started < seconds:
        if tick is not None:
            tick()
        else:
            time.sleep(0.1)
    return (calls(client) - before - 1) / (time.monotonic() - started)


def idle_consumer(client: redis.Redis, transport: str, queues: int, seconds: float) -> float:
    """Commands/s of one idle consumer of ``queues`` queues."""
    url = f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"
    names = ["email", "heavy", *[f"q{n}" for n in range(queues - 2)]][:queues]
    declared = [Queue(n, Exchange(n, type="direct"), routing_key=n) for n in names]
    options = {"priority_steps": [0]}
    with (
        Connection(url, transport=transport, transport_options=options) as connection,
        Consumer(connection, declared, on_message=lambda message: None, prefetch_count=1),
    ):

        def drain() -> None:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.5)

        warm = time.monotonic() + 3  # the first beats and sweeps, the fetch wait grown
        while time.monotonic() < warm:
            drain()
        return rate(client, seconds, drain)


def wake_up(client: redis.Redis, transport: str, queues: int, trials: int = TRIALS) -> (
    tuple[float, float]
):  # fmt: skip
    """p50 and p99 (ms) from a publish to its delivery in an idle consumer of ``queues``
    queues, over ``trials`` trials: each waits for the consumer's back-off to reach its
    longest (plus a random part of it, so the publish lands anywhere in a wait), then
    publishes to the queue after the one it last took from."""
    url = f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"
    names = [f"wake{queues}-{n}" for n in range(queues)]
    declared = [Queue(n, Exchange(n, type="direct"), routing_key=n) for n in names]
    # the back-off's longest held at BACKOFF_MAX (the default is 5 s): a bell wakes the
    # wait whatever its length, and 100 trials stay minutes long
    options = {"priority_steps": [0], "fetch_wait_max": BACKOFF_MAX}
    delivered: queues_.Queue[float] = queues_.Queue()
    stop = threading.Event()

    def on_message(message: Any) -> None:
        delivered.put(time.monotonic())
        message.ack()

    def consume() -> None:
        with (
            Connection(url, transport=transport, transport_options=options) as connection,
            Consumer(connection, declared, on_message=on_message, prefetch_count=1),
        ):
            delivered.put(0.0)  # consuming
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    connection.drain_events(timeout=0.5)

    rng = random.Random(SEED)
    samples: list[float] = []
    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    delivered.get(timeout=30)
    try:
        with Connection(url, transport=transport, transport_options=options) as publisher:
            producer = Producer(publisher.default_channel)
            for n in range(trials):
                time.sleep(BACKOFF_MAX * rng.uniform(1.1, 1.6))
                target = declared[(n + 1) % queues]
                sent = time.monotonic()
                producer.publish({"n": n}, exchange=target.exchange,
                                 routing_key=target.routing_key, declare=[target])  # fmt: skip
                samples.append((delivered.get(timeout=30) - sent) * 1000)
    finally:
        stop.set()
        thread.join(10)
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[98]


def fleet(client: redis.Redis, size: int, seconds: float) -> float:
    """Commands/s per simulated consumer of a fleet of ``size`` live keepers."""
    keepers = [
        liveness.Keeper(uuid.uuid4().hex, client=lambda: client, queues=lambda: ["email"],
                        inboxes=lambda: {}, restore=lambda: None, unacked_index="unacked_index",
                        recovery_timeout=30.0, mover_interval=DEFAULT_MOVER_INTERVAL)
        for _ in range(size)
    ]  # fmt: skip
    for keeper in keepers:
        keeper.start()
    try:
        time.sleep(2)
        return rate(client, seconds) / size
    finally:
        for keeper in keepers:
            keeper.stop()


def sweep_cost(client: redis.Redis, size: int) -> int:
    """Commands of one sweep when nobody died, with ``size`` consumers registered."""
    client.flushdb()
    now = float(client.time()[0])
    for _ in range(size):
        consumer = uuid.uuid4().hex
        client.zadd(CONSUMERS, {consumer: now + 30})
        client.hset(INBOXES, INBOX.format(consumer=consumer, source="email"), "email")
    liveness.give_back_dead(client, "sweeper", grace=30)  # sent whole once (EVALSHA next)
    before = calls(client)
    liveness.give_back_dead(client, "sweeper", grace=30)
    return calls(client) - before - 1


def section(report: Report, _client: Any, *, seconds: float = 10.0, trials: int = TRIALS) -> (
    None
):  # fmt: skip
    if shutil.which("redis-server") is None:
        report.notes.append("idle: skipped (no redis-server to count commands on)")
        return
    with own_redis() as client:
        for queues in (1, 2, 5):
            ours = idle_consumer(client, "conventions.transport.redis:Transport", queues, seconds)
            client.flushdb()
            kombu = idle_consumer(client, "redis", queues, seconds)
            client.flushdb()
            report.add(Row("idle", f"idle consumer of {queues} queue(s), commands/s", ours,
                           "cmd/s", "<= 5", f"kombu's BRPOP: {kombu:.1f}/s"))  # fmt: skip
        for queues in (1, 2, 5):
            p50, p99 = wake_up(client, "conventions.transport.redis:Transport", queues, trials)
            client.flushdb()
            raw50, raw99 = wake_up(client, "redis", queues, trials)
            client.flushdb()
            note = f"p50 {p50:.1f} ms; kombu's BRPOP p50 {raw50:.1f}, p99 {raw99:.1f} ms"
            report.add(Row("idle", f"idle consumer of {queues} queue(s), publish to start p99",
                           p99, "ms", "<= 50", note))  # fmt: skip
        for size in FLEETS:
            per = fleet(client, size, seconds)
            client.flushdb()
            report.add(Row("idle", f"keeper per consumer, fleet of {size}, commands/s", per,
                           "cmd/s", "<= 2"))  # fmt: skip
        for size in FLEETS:
            cost = sweep_cost(client, size)
            former = f"former design: {size + 1} (the registry, then one script per inbox)"
            what = f"one sweep, nobody dead, {size} consumers, commands"
            report.add(Row("idle", what, cost, "cmd", "<= 1", former))
        client.flushdb()
