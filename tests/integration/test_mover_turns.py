"""The delayed mover runs about once a second per queue across the fleet, not per worker.

Each consumer's keeper runs the mover script; a queue's turn (``_cc.mover.<queue>``,
taken inside the script, expiring) lets one consumer move it each second while the
others only look whether the turn is free, every ``recovery_timeout / 6``. A turn whose
holder died lapses, and the next look takes it. Keepers on a ``redis-server`` of the
test's own; ``MONITOR`` counts the scripts they send (a rate of timers: a loaded machine
sends fewer, never more).
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from conventions.transport import delayed, liveness, scripts
from conventions.transport.layout import MOVER
from tests.fixtures import unavailable
from tests.integration.helpers import SpareRedis, wait_for


@pytest.fixture
def own_redis() -> Iterator[SpareRedis]:
    if shutil.which("redis-server") is None:
        unavailable("redis-server (a Redis of the test's own)", FileNotFoundError())
    server = SpareRedis()
    server.start()
    yield server
    server.stop()


def keeper(client: redis.Redis, queue: str, recovery: float, interval: float) -> liveness.Keeper:
    return liveness.Keeper(
        uuid.uuid4().hex, client=lambda: client, queues=lambda: [queue], inboxes=lambda: {},
        restore=lambda: None, unacked_index="unacked_index", recovery_timeout=recovery,
        mover_interval=interval,
    )  # fmt: skip


def mover_calls(port: int, seconds: float) -> int:
    """The mover scripts clients send over ``seconds`` (``MONITOR``)."""
    sha = scripts.sha_of(delayed.MOVE)
    seen: list[str] = []
    client = redis.Redis(port=port)
    with client.monitor() as monitor:  # type: ignore[no-untyped-call]
        stop = threading.Event()

        def read() -> None:
            for line in monitor.listen():
                if "cc-stop" in line["command"]:
                    return
                if line.get("client_type") != "lua" and sha in line["command"]:
                    seen.append(line["command"])

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        time.sleep(seconds)
        stop.set()
        redis.Redis(port=port).echo("cc-stop")
        thread.join(10)
    return len(seen)


def test_two_idle_consumers_of_a_queue_move_it_about_once_a_second_between_them(
    own_redis: SpareRedis,
) -> None:
    with redis.Redis(port=own_redis.port) as client:
        keepers = [keeper(client, "email", recovery=30.0, interval=1.0) for _ in range(2)]
        for one in keepers:
            one.start()
        try:
            time.sleep(2)  # both ran once: one holds the turn, the other looks later
            window = 10.0
            calls = mover_calls(own_redis.port, window)
        finally:
            for one in keepers:
                one.stop()
    print(f"\nmover calls of 2 idle consumers: {calls / window:.2f}/s")
    # the holder each second, the other every 5 s: 1.2/s (each on its own: 2/s)
    assert calls / window <= 1.5


def test_a_turn_whose_holder_died_lapses_and_another_consumer_moves_the_queue(
    own_redis: SpareRedis,
) -> None:
    with redis.Redis(port=own_redis.port) as client:
        client.set(MOVER.format(queue="email"), "a-dead-consumer", px=1500)
        now = float(client.time()[0])
        client.zadd(delayed.key_of("email"), {"email\n" + '{"n": 1}': now})  # due
        alive = keeper(client, "email", recovery=3.0, interval=0.1)
        alive.start()
        try:
            assert client.lrange("email", 0, -1) == []  # the dead one's turn still runs
            wait_for(lambda: client.llen("email") == 1, timeout=30)
            assert client.get(MOVER.format(queue="email")) == alive.consumer.encode()
        finally:
            alive.stop()
        # a keeper that stops gives its turn up: the next consumer need not wait it out
        assert client.get(MOVER.format(queue="email")) is None


def test_the_mover_leaves_a_queue_whose_turn_another_holds_to_it(own_redis: SpareRedis) -> None:
    with redis.Redis(port=own_redis.port) as client:
        script = client.register_script(delayed.MOVE)
        now = float(client.time()[0])
        client.zadd(delayed.key_of("email"), {"email\n" + '{"n": 1}': now})
        first = delayed.move(client, script, ["email"], mover="a", turn=30)
        client.zadd(delayed.key_of("email"), {"email\n" + '{"n": 2}': now})
        second = delayed.move(client, script, ["email"], mover="b", turn=30)
        assert (first.moved, first.turns) == (1, 1)
        assert (second.moved, second.turns) == (0, 0)
        assert client.llen("email") == 1
        assert delayed.move(client, script, ["email"], mover="a", turn=30).moved == 1
