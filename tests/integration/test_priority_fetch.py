"""Priority steps on the layer's Redis transport, on a real Redis: a flood of high-priority
jobs cannot starve the lower steps (``conventions.transport.priorities``).

The bound is counted in fetches, never timed: each fetch of the consumer takes one
message, so the order of delivery is the order of the fetches.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection, Exchange, Producer, Queue

from conventions.transport import priorities
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.test_broker import consume

URL = f"{REDIS_BASE}/{BROKER_DB}"
STEPS = [0, 3, 6]
#: the weighted cycle's length for three steps: the lowest is looked at first once in it
CYCLE = 7
OPTIONS = {"priority_steps": STEPS, "recovery_timeout": 2, "fetch_wait": 0.05}


@pytest.fixture
def connection(services: None) -> Iterator[Connection]:
    with Connection(
        URL, transport="conventions.transport.redis:Transport", transport_options=OPTIONS
    ) as c:
        yield c


@pytest.fixture
def queue() -> Queue:
    name = f"priority-test-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def publish(connection: Connection, queue: Queue, level: str, count: int) -> None:
    producer = Producer(connection.default_channel)
    step = {"high": 0, "normal": 3, "low": 6}[level]
    for n in range(count):
        producer.publish({"level": level, "n": n}, exchange=queue.exchange,
                         routing_key=queue.routing_key, declare=[queue], priority=step)  # fmt: skip


def test_a_flood_of_high_priority_jobs_does_not_starve_the_low_ones(
    connection: Connection, queue: Queue
) -> None:
    publish(connection, queue, "high", 60)
    publish(connection, queue, "low", 3)

    got = consume(connection, [queue], 63)

    assert len(got) == 63
    low = [place for place, body in enumerate(got, 1) if body["level"] == "low"]
    # the k-th low job within k cycles of this one consumer's fetches, high still queued
    assert all(place <= k * CYCLE for k, place in enumerate(low, 1)), low
    assert [body["n"] for body in got if body["level"] == "low"] == [0, 1, 2]
    assert got[-1]["level"] == "high"


def test_each_step_gets_its_weighted_share_while_all_three_are_backlogged(
    connection: Connection, queue: Queue
) -> None:
    for level in ("high", "normal", "low"):
        publish(connection, queue, level, 30)

    got = consume(connection, [queue], 3 * CYCLE)

    levels = [body["level"] for body in got]
    for index, level in enumerate(("high", "normal", "low")):
        assert levels.count(level) == 3 * priorities.weights(3)[index], levels
    assert levels[0] == "high"


def test_with_nothing_higher_waiting_a_lower_step_is_served_at_once(
    connection: Connection, queue: Queue
) -> None:
    publish(connection, queue, "low", 5)

    got = consume(connection, [queue], 5)

    assert [body["n"] for body in got] == [0, 1, 2, 3, 4]
