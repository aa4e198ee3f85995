"""An ack rides the consumer's next fetch (:mod:`conventions.transport.acks`): no round
trip of its own, the message out of the unacked set before the fetch can take the next
one; a consumer that stops or closes sends what it holds; one whose broker is cut at
that moment loses no message (it stays unacked and is given back). On the test's Redis
(kombu's own consumer over the layer's transport), and through a cut proxy."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from conventions.transport import acks
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.helpers import CutProxy, Monitor

URL = f"{REDIS_BASE}/{BROKER_DB}"
OPTIONS = {"priority_steps": [0], "recovery_timeout": 2, "fetch_wait": 0.05}


@pytest.fixture
def queue() -> Queue:
    name = f"held-acks-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


@pytest.fixture
def client(services: None) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(URL)
    yield client
    client.close()


def publish(url: str, queue: Queue, count: int) -> None:
    with Connection(url, transport="conventions.transport.redis:Transport") as connection:
        producer = Producer(connection.default_channel)
        for i in range(count):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key=queue.routing_key,
                             declare=[queue])  # fmt: skip


def unacked(client: redis.Redis) -> set[str]:
    """The tags in kombu's unacked record or its index."""
    return {t.decode() for t in [*client.hkeys("unacked"), *client.zrange("unacked_index", 0, -1)]}


def test_an_ack_rides_the_next_fetch_and_the_last_one_goes_with_the_cancel(
    client: redis.Redis, queue: Queue
) -> None:
    publish(URL, queue, 5)
    before = unacked(client)
    seen: list[tuple[int, set[str]]] = []
    tags: list[str] = []

    def on_message(message: Any) -> None:
        tags.append(message.delivery_tag)
        message.ack()
        # held: still in the unacked set until the next fetch's write carries it
        seen.append((message.decode()["n"], unacked(client) - before))

    with (
        Monitor() as monitor,
        Connection(
            URL, transport="conventions.transport.redis:Transport", transport_options=OPTIONS
        ) as connection,
    ):
        with Consumer(connection, [queue], on_message=on_message):
            deadline = time.monotonic() + 10
            while len(tags) < 5 and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    connection.drain_events(timeout=0.5)
            assert len(tags) == 5
            assert unacked(client) - before == {tags[-1]}  # the last: no fetch came yet
        # the cancel sent it
        assert unacked(client) - before == set()

    assert [n for n, _ in seen] == [0, 1, 2, 3, 4]
    for (_, held), tag in zip(seen, tags, strict=True):
        assert tag in held  # acked, not yet sent
    # each earlier one went with the next fetch, its reply skipped: no transaction of its
    # own, and its ZREM written just before a fetch on the same connection
    commands = [(line["client_port"], str(line["command"])) for line in monitor.lines]
    for tag in tags[:-1]:
        at = next(i for i, (_, c) in enumerate(commands) if c.startswith("ZREM") and tag in c)
        port = commands[at][0]
        assert commands[at - 1] == (port, "CLIENT REPLY SKIP")
        after = [c for p, c in commands[at + 1 :] if p == port]
        assert after[0] == "CLIENT REPLY SKIP" and after[1].startswith("HDEL") and tag in after[1]
        assert after[2].split(" ", 1)[0] in ("BLMOVE", "EVALSHA", "BLPOP", "CLIENT")
    acked_alone = [
        c for i, (_, c) in enumerate(commands)
        if c.startswith("ZREM unacked_index") and commands[i - 1][1] == "MULTI"
    ]  # fmt: skip
    assert len(acked_alone) <= 1, acked_alone  # at most the last, sent by the cancel


def test_an_ack_held_when_the_broker_is_cut_is_not_lost_the_message_comes_back(
    client: redis.Redis, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    publish(URL, queue, 1)
    proxy = CutProxy(int(URL.rsplit(":", 1)[1].split("/", 1)[0]))
    url = f"redis://127.0.0.1:{proxy.port}/{BROKER_DB}"
    got: list[str] = []

    def on_message(message: Any) -> None:
        got.append(message.delivery_tag)
        message.ack()

    try:
        connection = Connection(
            url, transport="conventions.transport.redis:Transport", transport_options=OPTIONS
        )
        consumer = Consumer(connection, [queue], on_message=on_message)
        consumer.consume()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.5)
        assert len(got) == 1
        channel = connection.default_channel
        assert len(channel._held) == 1  # held for a fetch that will not come
        proxy.cut()
        with caplog.at_level(logging.WARNING, logger="conventions.transport.redis"):
            consumer.cancel()  # the cut is logged, not raised into kombu's teardown
        assert "could not send 1 held acks" in caplog.text
        assert len(channel._held) == 0
        with contextlib.suppress(Exception):  # kombu's own close may fail on the cut
            connection.release()
    finally:
        proxy.close()

    # not lost: still unacked, so the restore gives it back to its queue
    assert got[0] in unacked(client)
    with Connection(
        URL, transport="conventions.transport.redis:Transport", transport_options=OPTIONS
    ) as connection:
        channel = connection.default_channel
        client.zadd("unacked_index", {got[0]: 1})  # past any visibility timeout
        assert channel.qos.restore_past(None) >= 1
    assert client.llen(queue.name) == 1


def test_held_acks_are_bounded_and_sent_ahead_of_the_fetch_replies_skipped() -> None:
    held = acks.Held()
    assert held.commands("idx", "unacked") == []
    for i in range(acks.HELD_MAX):
        assert held.hold(f"t{i}")
    assert not held.hold("one too many")
    commands = held.commands("idx", "unacked")
    assert commands[0] == ["CLIENT", "REPLY", "SKIP"] and commands[2] == ["CLIENT", "REPLY", "SKIP"]
    assert commands[1][:2] == ["ZREM", "idx"] and commands[3][:2] == ["HDEL", "unacked"]
    assert commands[1][2:] == commands[3][2:] == [f"t{i}" for i in range(acks.HELD_MAX)]
    assert len(held.take()) == acks.HELD_MAX and len(held) == 0
