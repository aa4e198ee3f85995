"""``app.send_task`` by name refuses a version this app does not have, against a real broker.

The reference app registers ``email.send_receipt`` as v1 (an upcaster) and v2. A name of
that family at another version is a typo or a version skew: it is refused at the call
site and nothing reaches the queue. A name of a family this app does not register at all
is a task of another app (a worker elsewhere) and still publishes, as in Celery.
"""

from __future__ import annotations

import json

import pytest
import redis

from conventions import ConfigurationError, PayloadError
from tasks import app

pytestmark = pytest.mark.usefixtures("clean_store")


def test_an_unknown_version_of_a_registered_task_is_refused_and_nothing_is_queued(
    broker_redis: redis.Redis, store_redis: redis.Redis
) -> None:
    before = broker_redis.llen("email")
    with pytest.raises(ConfigurationError) as refused:
        app.send_task("email.send_receipt.v9", kwargs={"order_id": "ord_0001"})
    message = str(refused.value)
    assert "email.send_receipt.v9" in message
    assert "v1" in message and "v2" in message  # the versions this app registers
    assert "nothing was published" in message
    assert broker_redis.llen("email") == before
    assert store_redis.dbsize() == 0  # no reservation, no audit event


def test_a_registered_version_by_name_still_validates_its_payload(
    broker_redis: redis.Redis,
) -> None:
    before = broker_redis.llen("email")
    with pytest.raises(PayloadError, match="order_id"):
        app.send_task("email.send_receipt.v1", kwargs={"order_id": "bad id"})
    assert broker_redis.llen("email") == before


def test_a_task_of_another_app_is_still_published_by_name(broker_redis: redis.Redis) -> None:
    broker_redis.delete("email")
    result = app.send_task("billing.close_month.v3", kwargs={"month": "2026-11"}, queue="email")
    raw = broker_redis.lrange("email", 0, -1)
    assert [json.loads(entry)["headers"]["id"] for entry in raw] == [result.id]
    broker_redis.delete("email")
