"""A consumer's sign of life and its fetch go together, and no inbox that can still be
filled is forgotten: a message is never stranded in an inbox that nobody sweeps.

Two channels on a real Redis, each step driven by hand: ``blocked`` sends its ``BLMOVE``
and never reads the reply (it dies there), ``sweeper`` runs the restore sweep that every
worker runs. The interleaving that stranded a message: the blocked consumer's liveness
lapses while its ``BLMOVE`` still waits, a sweep forgets its (empty) inbox, the next
message lands in that inbox, and the consumer dies before claiming it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Queue

from conventions.config.profile import INBOX_TRANSPORT
from conventions.errors import ConfigurationError
from conventions.transport import redis as broker
from conventions.transport.layout import CONSUMERS, server_now
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.helpers import wait_for
from tests.integration.test_broker import consume, publish

URL = f"{REDIS_BASE}/{BROKER_DB}"
#: blocks of 2 s (``polling_interval`` is kombu's ``brpop_timeout``), liveness good for 5 s
OPTIONS = {"priority_steps": [0], "recovery_timeout": 5, "polling_interval": 2}


@pytest.fixture
def connection(services: None) -> Iterator[Connection]:
    with Connection(URL, transport=INBOX_TRANSPORT, transport_options=OPTIONS) as c:
        yield c


@pytest.fixture
def queue() -> Queue:
    name = f"inbox-gap-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def retire(client: Any, consumer: Any) -> None:
    """What a consumer's death does to its liveness: its keeper stops, its score lapses."""
    consumer.keeper.stop()
    client.zadd(CONSUMERS, {consumer.consumer_id: 1})


@contextlib.contextmanager
def blocked_consumer(queue: Queue, options: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    """A consumer of ``queue`` on a connection of its own that has sent its blocking
    fetch, as kombu's poller sends it, and whose reply nobody reads unless a test does."""
    with Connection(URL, transport=INBOX_TRANSPORT, transport_options=options) as own:
        channel = own.channel()
        Consumer(channel, [queue], on_message=lambda message: None).consume()
        channel.client.connection = channel.client.connection_pool.get_connection()
        channel._brpop_start()
        yield channel, broker.INBOX.format(consumer=channel.consumer_id, source=queue.name)


def read_reply(channel: Any, timeout: float = 10) -> bool:
    """The fetch's reply read as kombu's poller reads it: once the socket has it (the
    read itself never waits: a wake-up with nothing to read is ``Empty``)."""
    assert channel.client.connection.can_read(timeout=timeout), "no reply to the fetch"
    return bool(channel._brpop_read())


@pytest.fixture
def blocked(services: None, queue: Queue) -> Iterator[tuple[Any, str]]:
    with blocked_consumer(queue, OPTIONS) as consumer:
        yield consumer


def test_a_message_fetched_after_its_consumer_was_declared_dead_is_given_back(
    connection: Connection, queue: Queue, blocked: tuple[Any, str]
) -> None:
    (consumer, inbox), sweeper = blocked, connection.channel()
    client = sweeper.client

    retire(client, consumer)  # its sign of life goes while its BLMOVE waits
    assert sweeper.give_back_dead_inboxes() == 0  # nothing in its inbox yet
    publish(connection, queue, {"n": 1})
    wait_for(lambda: client.llen(inbox) == 1, timeout=1.5, every=0.01)
    consumer.client.connection.disconnect()  # it dies before claiming

    assert sweeper.give_back_dead_inboxes() == 1
    assert (client.llen(inbox), client.llen(queue.name)) == (0, 1)
    assert consume(connection, [queue], 1) == [{"n": 1}]
    sweeper.close()


def test_every_blocking_fetch_renews_the_sign_of_life_and_the_inbox_registration(
    services: None, queue: Queue
) -> None:
    client = redis.Redis.from_url(URL)
    # a sign of life good for 12 s, renewed by a fetch once a third of it went by
    with blocked_consumer(queue, {**OPTIONS, "recovery_timeout": 12}) as (consumer, inbox):
        consumer.keeper.stop()  # the fetch alone
        with pytest.raises(broker.Empty):
            read_reply(consumer)  # the first fetch times out after its 2 s block
        client.hdel(broker.INBOXES, inbox)  # as a sweep that found it dead would have
        client.zadd(CONSUMERS, {consumer.consumer_id: 1})
        consumer._live_at -= 4  # a third of its liveness ago

        consumer._brpop_start()  # the next fetch, at once
        wait_for(lambda: client.hexists(broker.INBOXES, inbox), timeout=1, every=0.01)
        left = (client.zscore(CONSUMERS, consumer.consumer_id) or 0) - server_now(client)
        assert left > 11  # a whole recovery_timeout again
        with pytest.raises(broker.Empty):
            read_reply(consumer)


def test_a_dead_consumers_empty_inbox_is_forgotten_only_after_recovery_timeout(
    connection: Connection, blocked: tuple[Any, str]
) -> None:
    (consumer, inbox), sweeper = blocked, connection.channel()
    client = sweeper.client
    consumer.client.connection.disconnect()
    retire(client, consumer)

    assert sweeper.give_back_dead_inboxes() == 0
    assert client.hexists(broker.INBOXES, inbox)  # a fetch may still be under way
    wait_for(
        lambda: sweeper.give_back_dead_inboxes() == 0
        and not client.hexists(broker.INBOXES, inbox),
        timeout=10, every=0.5,
    )  # fmt: skip
    sweeper.close()


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"recovery_timeout": 1}, r"recovery_timeout=1.*block"),
        ({"recovery_timeout": 5, "polling_interval": 3}, r"recovery_timeout=5.*3"),
        ({"inbox_timeout": 1}, r"recovery_timeout=1.*block"),  # its former name
        ({"polling_interval": 0}, r"block"),
        ({"recovery_timeout": 40}, r"recovery_timeout=40 is above 36 s"),
    ],
)
def test_a_recovery_timeout_not_well_above_the_block_time_or_above_a_minute_is_refused(
    services: None, options: dict[str, Any], complaint: str
) -> None:
    own = Connection(URL, transport=INBOX_TRANSPORT, transport_options=options)
    with own, pytest.raises(ConfigurationError, match=complaint):
        own.default_channel  # noqa: B018  (the channel is made on first use)


def test_a_broker_that_refuses_client_reply_stops_the_fetch_with_the_fix(
    services: None, queue: Queue
) -> None:
    admin, user = redis.Redis.from_url(URL), f"cc-noreply-{uuid.uuid4().hex[:8]}"
    admin.acl_setuser(user, enabled=True, nopass=True, keys=["*"], channels=["*"],
                      commands=["+@all", "-client|reply"])  # fmt: skip
    try:
        url = URL.replace("redis://", f"redis://{user}:x@", 1)
        with Connection(url, transport=INBOX_TRANSPORT, transport_options=OPTIONS) as own:
            channel = own.channel()
            Consumer(channel, [queue], on_message=lambda message: None).consume()
            channel.client.connection = channel.client.connection_pool.get_connection()
            channel._brpop_start()
            with pytest.raises(ConfigurationError, match=r"CLIENT REPLY.*\+client\|reply"):
                read_reply(channel)
    finally:
        admin.acl_deluser(user)


def test_a_wake_up_with_nothing_to_read_is_empty_at_once_and_keeps_the_fetch_in_flight(
    blocked: tuple[Any, str],
) -> None:
    """An event loop that reports this fetch's descriptor readable for another socket
    (a number reused after a reconnect) or after the socket closed: the read returns at
    once instead of waiting the socket timeout and calling a live connection lost."""
    consumer, _ = blocked
    started = time.monotonic()
    with pytest.raises(broker.Empty):
        consumer._brpop_read()  # the BLMOVE blocks 2 s: no reply yet
    assert time.monotonic() - started < 0.5
    assert consumer._in_poll is consumer.client.connection  # still in flight
    with pytest.raises(broker.Empty):
        read_reply(consumer)  # its own reply, when it comes: nothing fetched
    assert consumer._in_poll is None
    consumer.client.connection.disconnect()  # closed earlier in the same tick
    consumer._in_poll = consumer.client.connection
    with pytest.raises(broker.Empty):
        consumer._brpop_read()  # no "I/O operation on closed file"
    assert consumer._in_poll is None  # the next poll sends the fetch again


def test_an_error_reply_to_a_fetch_drops_its_connection_and_is_one_to_reconnect_from(
    services: None, queue: Queue
) -> None:
    """Replies still due on the connection would be out of step with the next fetch: it is
    dropped, and the error is a connection error (the worker reconnects, never stops)."""
    client = redis.Redis.from_url(URL)
    try:
        with blocked_consumer(queue, OPTIONS) as (consumer, _):
            with pytest.raises(broker.Empty):
                read_reply(consumer)  # the first fetch times out
            client.set(queue.name, "not a list")  # the next BLMOVE answers WRONGTYPE
            consumer._brpop_start()
            with pytest.raises(redis.ConnectionError, match="WRONGTYPE"):
                read_reply(consumer)
            assert consumer.client.connection._sock is None and not consumer._in_poll
    finally:
        client.delete(queue.name)
