"""What the layer's Redis transport holds beside the queues, seen from outside.

The keys are written here in the format :mod:`conventions.transport.layout` fixes (the
transport writes the same ones), in the broker's own Redis database, and read back by
the queues view, the exporter and the doctor: delayed (with the next due time), in
flight, in inboxes, consumers alive, and the oldest age counted from the due time.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from conventions.observability import queues
from conventions.ops import exporter as metrics
from conventions.ops import transport_view
from conventions.transport import layout
from tasks import app

DAY = 86400.0


def _message(queue: str, **headers: Any) -> str:
    """A kombu message routed to ``queue`` (the envelope the transport stores)."""
    tag = uuid.uuid4().hex
    return json.dumps({
        "body": "", "content-type": "application/json", "content-encoding": "utf-8",
        "headers": {"task": "testing.metered.v1", "id": tag, **headers},
        "properties": {"delivery_tag": tag, "delivery_info": {"exchange": "",
                                                              "routing_key": queue}},
    })  # fmt: skip


def _delay(client: redis.Redis, queue: str, due: float, source: str | None = None) -> None:
    member = f"{source or queue}\n{_message(queue)}"
    client.zadd(layout.DELAYED.format(queue=queue), {member: due})


def _consumer(client: redis.Redis, consumer: str, queues_: str, alive_for: float) -> None:
    now = layout.server_now(client)
    client.zadd(layout.CONSUMERS, {consumer: now + alive_for})
    about: Mapping[Any, Any] = {"queues": queues_, "host": "test", "pid": "1", "since": now}
    client.hset(layout.CONSUMER.format(consumer=consumer), mapping=about)


def _inbox(client: redis.Redis, consumer: str, source: str, count: int) -> None:
    inbox = layout.INBOX.format(consumer=consumer, source=source)
    client.hset(layout.INBOXES, inbox, source)
    for _ in range(count):
        client.lpush(inbox, _message(layout.queue_of_list(source)))


def _in_flight(client: redis.Redis, queue: str, count: int) -> None:
    for _ in range(count):
        raw = _message(queue)
        tag = json.loads(raw)["properties"]["delivery_tag"]
        client.hset("unacked", tag, json.dumps([json.loads(raw), "", queue]))
        client.zadd("unacked_index", {tag: time.time()})


@pytest.fixture
def broker(services: None, broker_redis: redis.Redis) -> Iterator[redis.Redis]:
    broker_redis.flushdb()
    yield broker_redis
    broker_redis.flushdb()


@pytest.fixture
def reader() -> Iterator[queues.BrokerQueues]:
    with transport_view.broker_reader(app) as found:
        assert found.holdings is not None  # the reference app runs the layer's transport
        yield found


def _states(reader: queues.BrokerQueues) -> dict[str, queues.QueueState]:
    return {state.queue: state for state in reader.read()}


def test_a_two_hour_countdown_and_a_seven_day_eta_show_as_delayed_with_the_next_due_time(
    broker: redis.Redis, reader: queues.BrokerQueues
) -> None:
    now = time.time()
    _delay(broker, "email", now + 7 * DAY)
    _delay(broker, "email", now + 7200)
    _delay(broker, "heavy", now + 60, source=f"heavy{layout.PRIORITY_SEP}3")

    found = layout.delayed(broker, "email")
    assert found.count == 2
    assert found.next_due is not None and abs(found.next_due - (now + 7200)) < 0.01
    states = _states(reader)
    email, heavy = states["email"], states["heavy"]
    assert (email.depth, email.delayed, heavy.delayed) == (0, 2, 1)
    assert email.next_due_in is not None and 7190 <= email.next_due_in <= 7200
    assert heavy.next_due_in is not None and 50 <= heavy.next_due_in <= 60
    # a delayed job is not waiting: the queue is empty and has no oldest age
    assert (email.oldest_age, email.age_source) == (None, "empty")


def test_a_job_overdue_in_the_delayed_set_has_a_negative_next_due(
    broker: redis.Redis, reader: queues.BrokerQueues
) -> None:
    _delay(broker, "email", time.time() - 90)
    email = _states(reader)["email"]
    assert email.next_due_in is not None and -100 <= email.next_due_in <= -90


def test_in_flight_in_inboxes_and_consumers_alive_are_counted_per_queue(
    broker: redis.Redis, reader: queues.BrokerQueues
) -> None:
    _consumer(broker, "c-live", "email,heavy", alive_for=30)
    _consumer(broker, "c-live-2", "email", alive_for=30)
    _consumer(broker, "c-dead", "email", alive_for=-1)  # its sign of life lapsed
    _inbox(broker, "c-live", "email", 2)
    _inbox(broker, "c-dead", f"heavy{layout.PRIORITY_SEP}6", 3)  # a priority list's inbox
    _inbox(broker, "c-live-2", "email", 0)  # registered, empty
    _in_flight(broker, "email", 4)
    _in_flight(broker, "heavy", 1)

    states = _states(reader)
    email, heavy = states["email"], states["heavy"]
    assert (email.in_flight, email.in_inboxes, email.consumers_alive) == (4, 2, 2)
    assert (heavy.in_flight, heavy.in_inboxes, heavy.consumers_alive) == (1, 3, 1)
    assert (email.delayed, email.next_due_in) == (0, None)


def test_the_oldest_age_counts_from_the_due_time_a_moved_job_carries(
    broker: redis.Redis, reader: queues.BrokerQueues
) -> None:
    now = datetime.now(UTC)
    published, due = now - timedelta(hours=2), now - timedelta(seconds=20)
    broker.lpush("email", _message("email", cc_enqueued_at=published.isoformat(),
                                   cc_due=due.isoformat()))  # fmt: skip
    email = _states(reader)["email"]
    assert email.age_source == "header"
    assert email.oldest_age is not None and 20 <= email.oldest_age < 30  # not 2 hours


def test_the_stock_transport_reads_no_holdings(broker: redis.Redis) -> None:
    stock = type(app)("stock_transport", set_as_current=False)
    stock.conf.update(broker_url=app.conf.broker_url, task_queues=list(app.amqp.queues.values()),
                      broker_transport=None)  # fmt: skip
    _delay(broker, "email", time.time() + 60)
    with transport_view.broker_reader(stock) as reader:
        email = _states(reader)["email"]
    assert (email.delayed, email.in_flight, email.consumers_alive) == (None, None, None)


def test_the_exporter_serves_the_holdings_as_gauges(
    broker: redis.Redis, clean_store: redis.Redis
) -> None:
    now = time.time()
    _delay(broker, "email", now - 5)  # overdue by 5 s
    _delay(broker, "email", now + 3600)
    _consumer(broker, "c-1", "email", alive_for=30)
    _in_flight(broker, "email", 2)
    _inbox(broker, "c-1", "email", 1)
    samples = _collect(metrics.Exporter(app))
    assert samples["queue_delayed", "email"] == 2
    assert 5 <= samples["queue_delayed_next_due_age_seconds", "email"] < 15
    assert ("queue_delayed_next_due_age_seconds", "heavy") not in samples  # nothing delayed
    assert samples["queue_delayed", "heavy"] == 0
    assert samples["queue_in_flight", "email"] == 2
    assert samples["queue_in_inboxes", "email"] == 1
    assert samples["queue_consumers_alive", "email"] == 1
    assert samples["queue_consumers_alive", "heavy"] == 0


def _collect(exporter: metrics.Exporter) -> dict[tuple[str, str], float]:
    try:
        out = {}
        for family in exporter.collect():
            for sample in family.samples:
                name = sample.name.removeprefix(f"{metrics.NAMESPACE}_")
                out[name, sample.labels.get("queue", "")] = sample.value
        return out
    finally:
        exporter.broker.close()


def test_the_doctor_reports_delayed_jobs_of_a_queue_nobody_consumes(
    broker: redis.Redis,
) -> None:
    from conventions.ops import doctor_live

    _delay(broker, "heavy", time.time() + 7 * DAY)
    live = doctor_live.Live(consumers={"w@h": ["email"]}, backlog={"email": 0, "heavy": 0})
    doctor_live._read_held(app, live, timeout=2.0)
    assert live.held["heavy"].delayed == 1
    errors = {(f.code, f.subject): f.message for f in doctor_live.live_checks(app, live)
              if f.level == "error"}  # fmt: skip
    assert "0 waiting, 1 delayed" in errors["queue-without-consumer", "heavy"]


def test_the_queues_view_shows_delayed_next_due_in_flight_inboxes_and_alive(
    broker: redis.Redis, clean_store: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    from conventions.cli import main as cli

    _delay(broker, "email", time.time() + 7 * DAY)
    _delay(broker, "email", time.time() + 7200)
    _delay(broker, "heavy", time.time() - 600)  # overdue: nobody moved it
    _consumer(broker, "c-1", "email", alive_for=30)
    _in_flight(broker, "email", 3)
    _inbox(broker, "c-1", "email", 1)
    assert cli.main(["-A", "tasks", "queues"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    rows = {line.split()[0]: dict(zip(header, line.split(), strict=True)) for line in lines[1:]}
    email, heavy = rows["email"], rows["heavy"]
    assert (email["DELAYED"], email["NEXT_DUE"]) == ("2", "2h")
    assert (email["IN_FLIGHT"], email["INBOXES"], email["ALIVE"]) == ("3", "1", "1")
    assert (heavy["DELAYED"], heavy["NEXT_DUE"], heavy["ALIVE"]) == ("1", "-10m", "0")
    assert cli.main(["-A", "tasks", "queues", "--json"]) == 0
    (email_json,) = [r for r in json.loads(capsys.readouterr().out) if r["queue"] == "email"]
    assert email_json["delayed"] == 2 and 7190 <= email_json["next_due_in"] <= 7200


def test_a_countdown_and_an_eta_published_through_the_transport_are_read_as_delayed(
    broker: redis.Redis, clean_store: redis.Redis, reader: queues.BrokerQueues
) -> None:
    from tests.integration import support_metrics

    week = datetime.now(UTC) + timedelta(days=7)
    support_metrics.metered.apply_async(kwargs={"item_id": "in_two_hours"}, countdown=7200)
    support_metrics.metered.apply_async(kwargs={"item_id": "next_week"}, eta=week)
    email = _states(reader)["email"]
    assert (email.depth, email.delayed) == (0, 2)
    assert email.next_due_in is not None and 7180 <= email.next_due_in <= 7200
    last = broker.zrange(layout.DELAYED.format(queue="email"), -1, -1, withscores=True)
    assert abs(float(last[0][1]) - week.timestamp()) < 1


def test_the_doctor_reads_the_first_node_of_a_failover_list_that_answers(
    broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conventions.ops import doctor_live
    from tests.acceptance.support_chaos import free_port

    _delay(broker, "heavy", time.time() + 7 * DAY)
    url = str(app.conf.broker_url)
    monkeypatch.setattr(app.conf, "broker_url", f"redis://127.0.0.1:{free_port()}/0;{url}")
    live = doctor_live.Live(consumers={"w@h": ["email"]}, backlog={"email": 0, "heavy": 0})
    doctor_live._read_held(app, live, timeout=2.0)
    assert live.held["heavy"].delayed == 1  # the first node is down: read on the second
