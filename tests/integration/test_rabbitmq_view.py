"""The queues view, the exporter and backpressure on a real RabbitMQ (``amqp://``).

A passive ``queue.declare`` gives a queue's ready messages and its consumers; the oldest
job's age cannot be read that way and is reported ``unknown`` with a note, never made up.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from kombu import Connection

from conventions.capacity import backpressure
from conventions.errors import ConfigurationError, QueueOverCapacity
from conventions.observability import queues
from conventions.ops import exporter as exporterlib
from tests.fixtures import unavailable
from tests.integration import support_rabbit as rabbit

APP = "tests.integration.support_rabbit:app"


@pytest.fixture
def amqp(store_redis: redis.Redis) -> Iterator[Connection]:
    """A connection to RabbitMQ; the app's ``q25_`` queues are deleted before and after."""
    connection = Connection(rabbit.AMQP_URL, connect_timeout=5)
    try:
        connection.ensure_connection(max_retries=1)
    except Exception as exc:
        unavailable("RabbitMQ", exc)
    assert rabbit.app.amqp is not None  # declares the workloads' queues on the app
    _delete_queues(connection)
    yield connection
    _delete_queues(connection)
    connection.release()


def _delete_queues(connection: Connection) -> None:
    channel = connection.channel()
    for name in (rabbit.VIEW, rabbit.BOUNDED, rabbit.DEFAULT):
        channel.queue_delete(name)
        channel.exchange_delete(name)
    channel.close()


def _declare(connection: Connection, name: str) -> None:
    for queue in rabbit.app.conf.task_queues:
        if queue.name == name:
            queue(connection.channel()).declare()


@pytest.fixture
def one_consumer(amqp: Connection) -> Iterator[Callable[[], None]]:
    """The view queue with one consumer holding one delivery (prefetch 1, unacked)."""
    _declare(amqp, rabbit.VIEW)
    consumer = Connection(rabbit.AMQP_URL, connect_timeout=5)
    channel = consumer.channel()
    channel.basic_qos(0, 1, False)
    got: list[Any] = []
    channel.basic_consume(rabbit.VIEW, callback=got.append)

    def hold_one() -> None:
        while not got:
            consumer.drain_events(timeout=10)

    yield hold_one
    consumer.release()


def _publish(count: int) -> None:
    run = uuid.uuid4().hex[:8]
    for n in range(count):
        rabbit.viewed.delay(item_id=f"v{run}{n}")


def test_a_queue_reads_its_ready_messages_and_its_consumer(
    one_consumer: Callable[[], None],
) -> None:
    _publish(4)
    one_consumer()  # one delivered and unacked: not ready, not counted
    with queues.from_app(rabbit.app) as reader:
        states = {state.queue: state for state in reader.read()}
    view = states[rabbit.VIEW]
    assert (view.depth, view.consumers) == (3, 1)
    assert (view.oldest_age, view.age_source) == (None, "unknown")
    assert view.note is not None and "age" in view.note
    held = (view.delayed, view.next_due_in, view.in_flight, view.in_inboxes, view.consumers_alive)
    assert held == (None, None, None, None, None)
    assert states[rabbit.BOUNDED].age_source == queues.NOT_DECLARED


def test_a_missing_queue_is_not_declared_not_an_error(amqp: Connection) -> None:
    assert queues.declared(amqp, "q25_never_declared") is None
    with queues.from_app(rabbit.app) as reader:
        state = {s.queue: s for s in reader.read()}[rabbit.DEFAULT]
    assert (state.depth, state.consumers, state.age_source) == (0, 0, queues.NOT_DECLARED)


def test_the_queues_command_prints_the_rabbitmq_figures(
    one_consumer: Callable[[], None], capsys: pytest.CaptureFixture[str]
) -> None:
    from conventions.cli import main as cli

    _publish(4)
    one_consumer()
    assert cli.main(["-A", APP, "queues", "--json"]) == 0
    rows = {row["queue"]: row for row in json.loads(capsys.readouterr().out)}
    view = rows[rabbit.VIEW]
    assert (view["depth"], view["consumers"], view["age_source"]) == (3, 1, "unknown")
    assert view["oldest_age"] is None and view["in_flight"] is None
    assert rows[rabbit.DEFAULT]["age_source"] == queues.NOT_DECLARED
    assert cli.main(["-A", APP, "queues"]) == 0  # the table too
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(rabbit.VIEW))
    assert line.split()[1:3] == ["3", "?"]


def _samples(app: Any) -> dict[tuple[str, str], float]:
    exporter = exporterlib.Exporter(app)
    try:
        return {
            (
                sample.name.removeprefix(f"{exporterlib.NAMESPACE}_"),
                sample.labels.get("queue", ""),
            ): sample.value
            for family in exporter.collect()
            for sample in family.samples
        }
    finally:
        exporter.broker.close()


def test_the_exporter_gauges_on_rabbitmq(one_consumer: Callable[[], None]) -> None:
    _publish(4)
    one_consumer()
    samples = _samples(rabbit.app)
    assert samples[("broker_up", "")] == 1
    assert samples[("queue_depth", rabbit.VIEW)] == 3
    assert samples[("queue_consumers", rabbit.VIEW)] == 1  # the broker's own count
    assert ("queue_oldest_age_seconds", rabbit.VIEW) not in samples  # unknown, not 0
    assert ("queue_oldest_age_seconds", rabbit.DEFAULT) in samples  # empty: 0
    assert ("queue_delayed", rabbit.VIEW) not in samples  # transport-only


@pytest.fixture
def bound(amqp: Connection) -> Iterator[Callable[..., None]]:
    before = rabbit.app.conf.get("conventions_backpressure")

    def set_bound(**spec: Any) -> None:
        rabbit.app.conf.update(conventions_backpressure={rabbit.BOUNDED: spec})
        rabbit.app.__dict__.pop("conventions_settings", None)
        backpressure.gauge.forget()

    _declare(amqp, rabbit.BOUNDED)
    yield set_bound
    rabbit.app.conf.update(conventions_backpressure=before)
    rabbit.app.__dict__.pop("conventions_settings", None)
    backpressure.gauge.forget()


def test_backpressure_max_depth_refuses_at_the_bound(
    bound: Callable[..., None], amqp: Connection
) -> None:
    bound(max_depth=3)
    for n in range(3):
        rabbit.bounded.delay(item_id=f"b{n}")
    with pytest.raises(QueueOverCapacity, match=r"queue 'q25_bounded' is over capacity"):
        rabbit.bounded.delay(item_id="b_over")
    assert queues.declared(amqp, rabbit.BOUNDED) == (3, 0)  # nothing published past it


def test_backpressure_reads_the_next_node_of_a_failover_list_when_the_first_is_down(
    bound: Callable[..., None],
) -> None:
    bound(max_depth=100)
    for n in range(2):
        rabbit.bounded.delay(item_id=f"f{n}")
    down = "amqp://guest:guest@127.0.0.1:1//"  # nothing listens on port 1
    conf = {"broker_url": f"{down};{rabbit.AMQP_URL}", "broker_connection_timeout": 2.0}
    app = SimpleNamespace(conf=SimpleNamespace(broker_url=conf["broker_url"], get=conf.get))
    gauge = backpressure.Gauge()  # a gauge of its own: nothing cached, no connection yet
    try:
        assert gauge.read(app, rabbit.BOUNDED).depth == 2  # read on the second node
    finally:
        for connection in gauge._amqp.values():
            connection.release()


def test_backpressure_max_age_is_refused_on_rabbitmq(
    bound: Callable[..., None], amqp: Connection
) -> None:
    bound(max_depth=100, max_age=60)
    with pytest.raises(ConfigurationError, match=r"max_age.*RabbitMQ does not tell"):
        rabbit.bounded.delay(item_id="aged")
    assert queues.declared(amqp, rabbit.BOUNDED) == (0, 0)


def test_the_queues_command_exits_3_when_rabbitmq_does_not_answer(
    store_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    from conventions.cli import main as cli

    assert cli.main(["-A", f"{rabbit.__name__}:unreachable", "queues", "--json"]) == 3
    assert "did not answer" in capsys.readouterr().err
