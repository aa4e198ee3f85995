"""Each priority level's depth and oldest age on a real Redis: in the queue reader, the
exporter and ``conventions queues``, so that a starved level shows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from conventions.cli.observe import table
from conventions.jobs import priority
from conventions.observability import queues
from conventions.observability.levels import LevelState
from conventions.ops.exporter import Exporter
from conventions.tracing import headers as hdr
from tests.conftest import BROKER_DB, REDIS_BASE

URL = f"{REDIS_BASE}/{BROKER_DB}"
OPTIONS = {"priority_steps": priority.STEPS, "recovery_timeout": 2}


@pytest.fixture
def lane(services: None, broker_redis: redis.Redis) -> Iterator[str]:
    name = f"levels-{uuid.uuid4().hex[:8]}"
    yield name
    broker_redis.delete(name, *(f"{name}{queues.PRIORITY_SEP}{s}" for s in priority.STEPS))


def publish(lane: str, level: str, count: int, waited: float) -> None:
    """``count`` jobs at ``level``, published ``waited`` seconds ago (their header says)."""
    since = (datetime.now(UTC) - timedelta(seconds=waited)).isoformat()
    queue = Queue(lane, Exchange(lane, type="direct"), routing_key=lane)
    with Connection(URL, transport="conventions.transport.redis:Transport",
                    transport_options=OPTIONS) as connection:  # fmt: skip
        producer = Producer(connection.default_channel)
        for n in range(count):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key=lane, declare=[queue],
                             priority=priority.REDIS_STEPS[level],
                             headers={hdr.ENQUEUED_AT: since})  # fmt: skip


def read(broker_redis: redis.Redis, lane: str) -> queues.QueueState:
    reader = queues.BrokerQueues(broker_redis, [lane], priority_steps=priority.STEPS)
    (state,) = reader.read()
    return state


def test_the_reader_gives_each_levels_depth_and_oldest_age(
    broker_redis: redis.Redis, lane: str
) -> None:
    publish(lane, "high", 2, waited=5)
    publish(lane, "low", 3, waited=600)

    state = read(broker_redis, lane)

    assert state.depth == 5
    assert [(lv.priority, lv.depth) for lv in state.levels] == [
        ("high", 2), ("normal", 0), ("low", 3)
    ]  # fmt: skip
    high, normal, low = state.levels
    assert high.oldest_age is not None and 5 <= high.oldest_age < 600
    assert normal.oldest_age is None
    assert low.oldest_age is not None and low.oldest_age >= 600


def test_the_exporter_shows_a_starved_level_apart(broker_redis: redis.Redis, lane: str) -> None:
    from tasks import app

    publish(lane, "high", 1, waited=1)
    publish(lane, "low", 1, waited=900)
    reader = queues.BrokerQueues(broker_redis, [lane], priority_steps=priority.STEPS)

    families = {family.name: family for family in Exporter(app, reader).collect()}

    depth = families["celery_conventions_queue_priority_depth"].samples
    age = families["celery_conventions_queue_priority_oldest_age_seconds"].samples
    assert {s.labels["priority"]: s.value for s in depth} == {"high": 1, "normal": 0, "low": 1}
    ages = {s.labels["priority"]: s.value for s in age}
    assert ages["low"] >= 900 > ages["high"]
    assert ages["normal"] == 0


def test_one_priority_step_adds_no_level_figures(broker_redis: redis.Redis, lane: str) -> None:
    publish(lane, "high", 1, waited=1)
    (state,) = queues.BrokerQueues(broker_redis, [lane], priority_steps=[0]).read()
    assert state.depth == 1 and state.levels == ()


def test_the_queues_table_puts_each_level_under_its_queue() -> None:
    levels = (LevelState("high", 1, 30.0), LevelState("low", 3, 700.0))
    state = queues.QueueState("email", 4, 30.0, "header", levels=levels)
    row = {**state.to_dict(), "slo": 120.0, "in_per_s": None, "out_per_s": None}

    lines = table([row]).splitlines()

    assert [line.split()[:3] for line in lines[1:]] == [
        ["email", "4", "30s"], ["email[high]", "1", "30s"], ["email[low]", "3", "12m"]
    ]  # fmt: skip
