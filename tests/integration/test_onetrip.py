"""The publish in one round trip (``conventions.transport.publish``): with the broker and the store
on one Redis server, ``.delay()`` reserves its key and pushes its message in one script.

Redis ``MONITOR`` shows every command the server runs; a command a script runs is marked
``lua``. So the test counts what the publish itself sent: one script, no ``LPUSH`` and no
separate reservation.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from conventions import App, bind
from conventions.task import DuplicateResult
from conventions.transport import publish as onetrip
from conventions.transport import redis as broker
from tasks import app
from tasks.receipts import send_receipt
from tests.integration.helpers import Monitor, SentEvents

pytestmark = pytest.mark.usefixtures("clean_store")


@pytest.fixture
def order_id() -> Iterator[str]:
    yield f"ord_{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def scripts_loaded() -> None:
    """One publish first: a server that does not know the script yet answers the first
    ``EVALSHA`` with ``NOSCRIPT`` (a second one, which ``MONITOR`` would count)."""
    send_receipt.delay(order_id=f"ord_warm_{uuid.uuid4().hex[:8]}")


def test_the_test_setup_publishes_in_one_trip() -> None:
    assert onetrip.eligible(app, app.store)


def test_a_delay_reserves_and_pushes_in_one_script(
    broker_redis: redis.Redis, order_id: str
) -> None:
    before = broker_redis.llen("email")
    correlation = f"corr-{order_id}"
    with Monitor() as monitor, bind(correlation_id=correlation):
        handle = send_receipt.delay(order_id=order_id)
    # one script carries the job (the two-step path shows a reservation script and an
    # LPUSH here; the task-sent event's body is encoded, so it does not name the order)
    sent = monitor.top_level(order_id)
    assert sent == ["EVALSHA"], sent
    assert {"SET", "RPUSH", "LPUSH"} <= set(monitor.scripted(order_id))
    # what the two-step path would have left: the reservation, the audit event, the job
    assert broker_redis.llen("email") == before + 1
    assert (
        app.store.reserve(f"email.send_receipt:receipt:{order_id}", "someone-else", 60) == handle.id
    )
    assert [e.event for e in app.store.audit_for(correlation)] == ["published"]


def test_a_delay_rings_its_queues_bell_in_the_same_script(order_id: str) -> None:
    bell = broker.bell_of("email")
    with Monitor() as monitor:
        send_receipt.delay(order_id=order_id)
    assert monitor.top_level(order_id) == ["EVALSHA"]
    assert monitor.top_level(bell) == ["EVALSHA"]  # the same script: no command of its own
    assert monitor.scripted(bell) == ["LPUSH", "LTRIM", "EXPIRE"]


def test_a_delays_task_sent_event_is_published_by_its_push_script(order_id: str) -> None:
    """Celery publishes the message, then its ``task-sent`` event, a round trip each; the
    push waits for the event and publishes it in its script: the whole ``.delay()`` is one
    round trip, and the event is Celery's own (its fields, the queue, the clock)."""
    with SentEvents() as events, Monitor() as monitor:
        handle = send_receipt.delay(order_id=order_id)
        sent = events.received(order_id)
    assert [(e["type"], e["uuid"]) for e in sent] == [("task-sent", handle.id)]
    event = sent[0]
    assert event["name"] == send_receipt.name and order_id in event["kwargs"]
    assert (event["queue"], event["routing_key"]) == ("email", "email")
    assert isinstance(event["clock"], int) and event["hostname"]
    # the job's one command is the script, which carries the event (received once: no
    # PUBLISH of the client's beside it)
    sent_by_client = [
        line["command"] for line in monitor.lines
        if line.get("client_type") != "lua" and order_id in line["command"]
    ]  # fmt: skip
    assert [command.split()[0].upper() for command in sent_by_client] == ["EVALSHA"]
    assert "celeryev/task.sent" in sent_by_client[0]
    assert "PUBLISH" in monitor.scripted("celeryev")


def test_a_duplicate_sends_no_task_sent_event(order_id: str) -> None:
    first = send_receipt.delay(order_id=order_id)
    with SentEvents() as events:
        second = send_receipt.delay(order_id=order_id)
        assert events.received(order_id) == []
    assert isinstance(second, DuplicateResult) and second.id == first.id


class Silent:
    """An event dispatcher that publishes nothing (``event_dispatcher=`` of a publish):
    the event never reaches the transport, as when it goes through another channel."""

    def publish(self, *_: Any, **__: Any) -> None:
        return None


def test_a_push_whose_event_never_comes_is_pushed_after_the_publish(
    broker_redis: redis.Redis, order_id: str
) -> None:
    before = broker_redis.llen("email")
    with SentEvents() as events:
        handle = send_receipt.apply_async(kwargs={"order_id": order_id}, event_dispatcher=Silent())
        assert events.received(order_id) == []
    assert broker_redis.llen("email") == before + 1
    assert app.store.reserve(f"email.send_receipt:receipt:{order_id}", "x", 60) == handle.id


def test_a_duplicate_pushes_nothing_and_answers_the_holder(
    broker_redis: redis.Redis, order_id: str
) -> None:
    first = send_receipt.delay(order_id=order_id)
    depth = broker_redis.llen("email")
    second = send_receipt.delay(order_id=order_id)
    assert isinstance(second, DuplicateResult) and second.id == first.id
    assert broker_redis.llen("email") == depth


def test_another_server_or_the_sql_store_takes_the_two_step_path() -> None:
    other = App("onetrip_other", set_as_current=False)
    other.conf.update(broker_url="redis://queue.internal:6379/0",
                      broker_transport="conventions.transport.redis:Transport")  # fmt: skip
    assert not onetrip.eligible(other, app.store)
    kombu = App("onetrip_kombu", set_as_current=False)
    kombu.conf.update(broker_url=app.conf.broker_url)  # kombu's own Redis transport
    assert not onetrip.eligible(kombu, app.store)
    assert not onetrip.eligible(app, object())
