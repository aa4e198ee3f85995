"""Priority steps on the layer's Redis transport, on a real Redis: a flood of high-priority
jobs cannot starve the lower steps (``conventions.transport.priorities``).

The bound is counted in fetches, never timed: each fetch of the consumer takes one
message, so the order of delivery is the order of the fetches.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from conventions import App, Id, JobContext, Payload
from conventions.config.profile import reliable
from conventions.jobs import priority
from conventions.transport import priorities
from conventions.transport.layout import PRIORITY_SEP
from tests.conftest import BROKER_DB, REDIS_BASE, STORE_DB
from tests.integration.test_broker import consume

URL = f"{REDIS_BASE}/{BROKER_DB}"
#: the weighted cycle's length for three steps: the lowest is looked at first once in it
CYCLE = 7
OPTIONS = {"priority_steps": priority.STEPS, "recovery_timeout": 2, "fetch_wait": 0.05}


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
    step = priority.REDIS_STEPS[level]
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


class Note(Payload):
    note_id: Id


def _levels_app(lane: str) -> App:
    """An app with the capacity how-to's settings: the steps on, and
    ``task_default_priority = 3`` (normal) for the jobs with no level."""
    app = App(f"levels-{lane}", set_as_current=False)
    app.conf.update(
        reliable(broker_url=URL, store_url=f"{REDIS_BASE}/{STORE_DB}",
                 broker_transport_options={"priority_steps": priority.STEPS}),
        conventions_workloads={"notes": lane, "urgent": lane},
        conventions_workload_priorities={"urgent": "high"},
        task_default_priority=3,
    )  # fmt: skip
    return app


def test_with_the_how_tos_settings_sixty_high_jobs_do_not_starve_three_low_ones(
    broker_redis: redis.Redis, clean_store: redis.Redis
) -> None:
    """docs/howto/capacity.md's settings, ``task_default_priority = 3`` among them: each
    job's level wins over the default (Celery applies the default over the route's)."""
    lane = f"lane-{uuid.uuid4().hex[:6]}"
    app = _levels_app(lane)

    @app.job("testing.note_soon.v1", payload=Note, key="soon:{note_id}", workload="notes",
             priority="high")  # fmt: skip
    def soon(payload: Note, ctx: JobContext) -> None: ...  # pragma: no cover (never run)

    @app.job("testing.note_last.v1", payload=Note, key="last:{note_id}", workload="notes",
             priority="low")  # fmt: skip
    def last(payload: Note, ctx: JobContext) -> None: ...  # pragma: no cover (never run)

    queue = Queue(lane, Exchange(lane, type="direct"), routing_key=lane)
    try:
        for n in range(60):
            soon.delay(note_id=f"h_{n}")
        for n in range(3):
            last.delay(note_id=f"l_{n}")
        with Connection(
            URL, transport="conventions.transport.redis:Transport", transport_options=OPTIONS
        ) as connection:
            got = consume(connection, [queue], 63)
        notes = [body[1]["note_id"] for body in got]
        assert len(notes) == 63
        low = [place for place, note in enumerate(notes, 1) if note.startswith("l_")]
        assert low == sorted(low) and len(low) == 3
        # the k-th low job by the k-th cycle of this one consumer's fetches: 7, 14, 21
        assert all(place <= k * CYCLE for k, place in enumerate(low, 1)), low
    finally:
        broker_redis.delete(lane, *(f"{lane}{PRIORITY_SEP}{step}" for step in (3, 6)))
        app.close()


def test_a_jobs_level_and_its_workloads_decide_the_list_its_message_waits_in(
    broker_redis: redis.Redis, clean_store: redis.Redis
) -> None:
    lane = f"lane-{uuid.uuid4().hex[:6]}"
    app = _levels_app(lane)

    @app.job("testing.note_later.v1", payload=Note, key="later:{note_id}", workload="notes",
             priority="low")  # fmt: skip
    def later(payload: Note, ctx: JobContext) -> None: ...  # pragma: no cover (never run)

    @app.job("testing.note_now.v1", payload=Note, key="now:{note_id}", workload="urgent")
    def now(payload: Note, ctx: JobContext) -> None: ...  # pragma: no cover (never run)

    low_list = f"{lane}{PRIORITY_SEP}6"
    try:
        low, high = later.delay(note_id="n_1"), now.delay(note_id="n_2")
        assert [json.loads(raw)["headers"]["id"] for raw in broker_redis.lrange(lane, 0, -1)] == [
            high.id
        ]
        assert [json.loads(r)["headers"]["id"] for r in broker_redis.lrange(low_list, 0, -1)] == [
            low.id
        ]
    finally:
        broker_redis.delete(lane, low_list)
        app.close()
