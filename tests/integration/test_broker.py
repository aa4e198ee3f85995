"""The inbox fetch (``conventions.transport.redis``) on a real Redis: a message is always in its
queue, in an inbox or in the unacked set, and a dead consumer's inbox goes back.

The crash itself (kill -9 of a worker mid-fetch) is the chaos suite's; here each step of
the protocol is driven by hand so that every interleaving is checked, not hoped for.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from conventions.transport import layout
from conventions.transport import redis as broker
from conventions.transport.layout import CONSUMERS
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.helpers import wait_for

URL = f"{REDIS_BASE}/{BROKER_DB}"
OPTIONS = {"priority_steps": [0], "recovery_timeout": 2, "fetch_wait": 0.05}


@pytest.fixture
def connection(services: None) -> Iterator[Connection]:
    with Connection(
        URL, transport="conventions.transport.redis:Transport", transport_options=OPTIONS
    ) as c:
        yield c


@pytest.fixture
def queue() -> Queue:
    name = f"inbox-test-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def publish(connection: Connection, queue: Queue, *bodies: Any) -> None:
    producer = Producer(connection.default_channel)
    for body in bodies:
        producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key,
                         declare=[queue])  # fmt: skip


def consume(connection: Connection, queues: list[Queue], count: int, within: float = 10) -> (
    list[Any]
):  # fmt: skip
    """Drain ``count`` messages (acking each), in the order they arrive, for ``within``
    seconds at most."""
    got: list[Any] = []

    def on_message(message: Any) -> None:
        got.append(message.decode() if message.content_type == "application/json" else message)
        message.ack()

    with Consumer(connection, queues, on_message=on_message):
        deadline = time.monotonic() + within
        while len(got) < count and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.5)
    return got


def dead_consumer_fetches(client: redis.Redis, queue: str) -> str:
    """What a consumer killed right after its BLMOVE leaves: an entry in its inbox."""
    consumer = uuid.uuid4().hex
    inbox = broker.INBOX.format(consumer=consumer, source=queue)
    client.hset(broker.INBOXES, inbox, queue)
    client.zadd(CONSUMERS, {consumer: layout.server_now(client) + 0.3})  # alive 0.3 s more
    assert client.lmove(queue, inbox, "RIGHT", "LEFT") is not None
    return inbox


def test_the_app_publishes_and_consumes_through_the_inbox_transport() -> None:
    from tasks import app

    assert isinstance(app.connection_for_write().transport, broker.Transport)


def test_a_dead_consumers_inbox_goes_back_to_the_head_of_its_queue(
    connection: Connection, queue: Queue
) -> None:
    publish(connection, queue, {"n": 0}, {"n": 1}, {"n": 2})
    client = connection.default_channel.client
    inbox = dead_consumer_fetches(client, queue.name)
    channel = connection.default_channel

    assert channel.give_back_dead_inboxes() == 0  # still alive: left alone
    assert (client.llen(inbox), broker.in_inboxes(client) >= 1) == (1, True)
    consumer = broker.consumer_of(inbox)
    lapsed = lambda: (client.zscore(CONSUMERS, consumer) or 0) < layout.server_now(client)  # noqa: E731
    wait_for(lambda: lapsed() or None, timeout=5, every=0.05)  # its score lapsed
    assert channel.give_back_dead_inboxes() == 1
    # emptied, still known: a fetch of its consumer may still be under way
    assert (client.llen(inbox), client.hexists(broker.INBOXES, inbox)) == (0, True)
    # the fetched message was the oldest: it is delivered first, and once
    assert consume(connection, [queue], 3) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(queue.name.encode() not in v for v in client.hvals(channel.unacked_key))


def test_a_slow_consumer_whose_message_was_given_back_drops_its_copy(
    connection: Connection, queue: Queue
) -> None:
    publish(connection, queue, {"n": 0})
    slow, sweeper = connection.channel(), connection.channel()
    try:
        inbox = broker.INBOX.format(consumer=slow.consumer_id, source=queue.name)
        client = slow.client
        client.zadd(CONSUMERS, {slow.consumer_id: layout.server_now(client) + 60})
        client.hset(broker.INBOXES, inbox, queue.name)  # what its last fetch sent
        entry = client.lmove(queue.name, inbox, "RIGHT", "LEFT")
        client.zadd(CONSUMERS, {slow.consumer_id: 1})  # it was stalled past its liveness

        assert sweeper.give_back_dead_inboxes() == 1
        assert slow._claim_and_deliver(inbox, entry, queue.name, queue.name) is False
        assert client.llen(queue.name) == 1  # the message is in its queue, once
        tag = json.loads(entry)["properties"]["delivery_tag"]
        assert not client.hexists(slow.unacked_key, tag)
        assert consume(connection, [queue], 1) == [{"n": 0}]
    finally:
        slow.close()
        sweeper.close()


def test_a_worker_reading_two_queues_gets_messages_from_both_and_leaves_no_inbox_entry(
    connection: Connection, queue: Queue
) -> None:
    other = Queue(f"{queue.name}-b", Exchange(f"{queue.name}-b", type="direct"),
                  routing_key=f"{queue.name}-b")  # fmt: skip
    publish(connection, queue, {"q": "a", "n": 0})
    publish(connection, other, {"q": "b", "n": 0}, {"q": "b", "n": 1})
    got = consume(connection, [queue, other], 3)
    assert sorted((body["q"], body["n"]) for body in got) == [("a", 0), ("b", 0), ("b", 1)]
    client = connection.default_channel.client
    inboxes = [i for i in client.hkeys(broker.INBOXES) if queue.name.encode() in i]
    assert inboxes and all(client.llen(inbox) == 0 for inbox in inboxes)


def test_an_entry_that_is_not_a_kombu_message_is_handed_over_wrapped_not_raised(
    connection: Connection, queue: Queue
) -> None:
    publish(connection, queue, {"n": 0})
    connection.default_channel.client.lpush(queue.name, b"\xff not a message")
    first, second = consume(connection, [queue], 2)
    assert first == {"n": 0}
    assert (second.content_type, second.body) == (broker.UNPARSEABLE, b"\xff not a message")


def test_the_channel_reuses_one_client_per_pool_and_a_new_pool_gets_a_new_one(
    connection: Connection, queue: Queue
) -> None:
    """kombu builds a ``redis.Redis`` per command; ours keeps one per pool (the publish,
    the ack and the claim each spent ~120 us building one). A reconnect makes a new pool:
    the next command gets a client of that pool, and the messages still flow."""
    channel = connection.default_channel
    first = channel._create_client()
    assert channel._create_client() is first
    with channel.conn_or_acquire() as client:
        assert client is first
    publish(connection, queue, {"n": 1})
    channel._disconnect_pools()  # what kombu does when the connection is lost
    second = channel._create_client()
    assert second is not first
    assert second.connection_pool is channel.pool
    publish(connection, queue, {"n": 2})
    assert consume(connection, [queue], 2) == [{"n": 1}, {"n": 2}]
