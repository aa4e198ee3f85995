"""No-ack consumers on the inbox transport leave nothing in kombu's unacked set.

The claim used to record every fetched message as unacked before kombu knew the
consumer was a no-ack one: nothing acks such a message, so each ``celery inspect``
reply (and each reply ``conventions doctor``, ``queues`` and the metrics exporter read)
stayed in the unacked set and came back every visibility timeout. Real Redis, real
worker (threads: the fetch path is the same transport).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.helpers import wait_for

URL = f"{REDIS_BASE}/{BROKER_DB}"
OPTIONS = {"priority_steps": [0], "inbox_timeout": 2, "fetch_wait": 0.05}


@pytest.fixture
def connection(services: None) -> Iterator[Connection]:
    with Connection(
        URL, transport="conventions.transport.redis:Transport", transport_options=OPTIONS
    ) as c:
        yield c


def _unacked(client: redis.Redis) -> tuple[int, int]:
    return int(client.hlen("unacked")), int(client.zcard("unacked_index"))


def _drain(connection: Connection, queue: Queue, no_ack: bool) -> list[Any]:
    got: list[Any] = []
    with Consumer(connection, [queue], on_message=got.append, no_ack=no_ack):
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.5)
    return got


def test_a_no_ack_consumer_leaves_no_record_in_the_unacked_set(
    connection: Connection, broker_redis: redis.Redis
) -> None:
    name = f"noack-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    producer = Producer(connection.default_channel)
    for body in ("for no-ack", "for ack"):
        producer.publish(body, exchange=queue.exchange, routing_key=name, declare=[queue])
    broker_redis.delete("unacked", "unacked_index")
    assert [m.body for m in _drain(connection, queue, no_ack=True)] == [b"for no-ack"]
    assert _unacked(broker_redis) == (0, 0)
    # an acking consumer of the same queue still has its message recorded until its ack
    (message,) = _drain(connection, queue, no_ack=False)
    assert _unacked(broker_redis) == (1, 1)
    message.ack()
    assert _unacked(broker_redis) == (0, 0)


@pytest.mark.usefixtures("thread_worker")
def test_inspect_ping_replies_leave_nothing_in_the_unacked_set(broker_redis: redis.Redis) -> None:
    from tasks import app

    wait_for(lambda: app.control.inspect(timeout=1).ping())  # the worker's consumer is up
    broker_redis.delete("unacked", "unacked_index")
    for _ in range(3):
        replies = app.control.inspect(timeout=1).ping()
        assert replies and all(r == {"ok": "pong"} for r in replies.values()), replies
        # what ``conventions doctor``, ``queues`` and the exporter ask the workers
        assert app.control.inspect(timeout=1).active_queues()
    assert _unacked(broker_redis) == (0, 0)
