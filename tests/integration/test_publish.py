"""The publish side of the task contract, against a real Redis broker."""

from __future__ import annotations

import pytest
import redis

from conventions import PayloadError, bind
from conventions.tracing.headers import CORRELATION, IDEMPOTENCY_KEY
from tasks import app
from tasks.receipts import send_receipt

pytestmark = pytest.mark.usefixtures("clean_store")


def test_bad_delay_calls_raise_naming_the_field_and_enqueue_nothing(
    broker_redis: redis.Redis,
) -> None:
    before = broker_redis.llen("email")
    with pytest.raises(PayloadError) as too_long:
        send_receipt.delay(order_id="x" * 5000)
    assert too_long.value.fields == ["order_id"]
    with pytest.raises(PayloadError, match="email"):
        send_receipt.delay(order_id="ok", email="a@b.c")
    with pytest.raises(PayloadError, match="order_id"):
        send_receipt.delay()
    with pytest.raises(PayloadError, match="keyword arguments only"):
        send_receipt.delay("ord_0001")
    assert broker_redis.llen("email") == before


def test_send_task_by_name_validates_like_delay(broker_redis: redis.Redis) -> None:
    before = broker_redis.llen("email")
    with pytest.raises(PayloadError, match="order_id"):
        app.send_task("email.send_receipt.v2", kwargs={"order_id": "bad id"})
    assert broker_redis.llen("email") == before


def test_a_second_publish_of_a_pending_key_is_marked_duplicate_and_not_enqueued(
    broker_redis: redis.Redis,
) -> None:
    broker_redis.delete("email")
    first = send_receipt.delay(order_id="ord_dup_1")
    second = send_receipt.delay(order_id="ord_dup_1")
    assert first.deduplicated is False
    assert second.deduplicated is True
    assert second.id == first.id
    assert broker_redis.llen("email") == 1
    broker_redis.delete("email")


def test_a_publish_carries_our_headers_and_the_bound_correlation_id(
    broker_redis: redis.Redis,
) -> None:
    import json

    broker_redis.delete("email")
    with bind(correlation_id="corr-123", actor_id="user_7"):
        send_receipt.delay(order_id="ord_hdr_1")
    raw = json.loads(broker_redis.lindex("email", 0) or "{}")
    headers = raw["headers"]
    assert headers[CORRELATION] == "corr-123"
    assert headers[IDEMPOTENCY_KEY] == "receipt:ord_hdr_1"
    assert headers["cc_actor"] == "user_7"
    assert "corr-123" in headers["kwargsrepr"]
    broker_redis.delete("email")


def test_tasks_route_by_workload_to_their_queue(broker_redis: redis.Redis) -> None:
    import datetime as dt

    from tasks.reports import daily_sales

    broker_redis.delete("heavy")
    daily_sales.delay(business_date=dt.date(2026, 11, 30))
    assert broker_redis.llen("heavy") == 1
    broker_redis.delete("heavy")
