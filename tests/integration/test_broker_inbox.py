"""A consumer's sign of life and its fetch go together, and no inbox that can still be
filled is forgotten: a message is never stranded in an inbox that nobody sweeps.

Two channels on a real Redis, each step driven by hand: ``blocked`` sends its ``BLMOVE``
and never reads the reply (it dies there), ``sweeper`` runs the restore sweep that every
worker runs. The interleaving that stranded a message: the blocked consumer's alive key
goes while its ``BLMOVE`` still waits, a sweep forgets its (empty) inbox, the next
message lands in that inbox, and the consumer dies before claiming it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Queue

from conventions.config.profile import INBOX_TRANSPORT
from conventions.errors import ConfigurationError
from conventions.transport import redis as broker
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.helpers import wait_for
from tests.integration.test_broker import consume, publish

URL = f"{REDIS_BASE}/{BROKER_DB}"
#: blocks of 2 s (``polling_interval`` is kombu's ``brpop_timeout``), inboxes kept 5 s
OPTIONS = {"priority_steps": [0], "inbox_timeout": 5, "polling_interval": 2}


@pytest.fixture
def connection(services: None) -> Iterator[Connection]:
    with Connection(URL, transport=INBOX_TRANSPORT, transport_options=OPTIONS) as c:
        yield c


@pytest.fixture
def queue() -> Queue:
    name = f"inbox-gap-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


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


@pytest.fixture
def blocked(services: None, queue: Queue) -> Iterator[tuple[Any, str]]:
    with blocked_consumer(queue, OPTIONS) as consumer:
        yield consumer


def test_a_message_fetched_after_its_consumer_was_declared_dead_is_given_back(
    connection: Connection, queue: Queue, blocked: tuple[Any, str]
) -> None:
    (consumer, inbox), sweeper = blocked, connection.channel()
    client = sweeper.client

    client.delete(consumer.alive_key)  # its sign of life goes while its BLMOVE waits
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
    # a sign of life good for 12 s: a fetch 2 s after the last is well within it
    with blocked_consumer(queue, {**OPTIONS, "inbox_timeout": 12}) as (consumer, inbox):
        with pytest.raises(broker.Empty):
            consumer._brpop_read()  # the first fetch times out after its 2 s block
        client.hdel(broker.INBOXES, inbox)  # as a sweep that found it dead would have

        consumer._brpop_start()  # the next fetch, at once
        wait_for(lambda: client.hexists(broker.INBOXES, inbox), timeout=1, every=0.01)
        assert client.pttl(consumer.alive_key) > 11_000  # a whole inbox_timeout again
        with pytest.raises(broker.Empty):
            consumer._brpop_read()


def test_a_dead_consumers_empty_inbox_is_forgotten_only_after_inbox_timeout(
    connection: Connection, blocked: tuple[Any, str]
) -> None:
    (consumer, inbox), sweeper = blocked, connection.channel()
    client = sweeper.client
    consumer.client.connection.disconnect()
    client.delete(consumer.alive_key)

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
        ({"inbox_timeout": 1}, r"inbox_timeout=1.*block"),
        ({"inbox_timeout": 5, "polling_interval": 3}, r"inbox_timeout=5.*3"),
        ({"polling_interval": 0}, r"block"),
    ],
)
def test_an_inbox_timeout_not_well_above_the_block_time_is_refused_at_setup(
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
                channel._brpop_read()
    finally:
        admin.acl_deluser(user)
