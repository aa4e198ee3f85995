"""Backpressure: with no worker consuming, the publish that crosses a queue's bound is
refused (or shed, by the task's policy); what was accepted is all run later."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest.mock import ANY

import pytest
import redis

from conventions import bind
from conventions.capacity import backpressure
from conventions.errors import QueueOverCapacity
from conventions.task import DuplicateResult
from tasks import app
from tests.integration import support_capacity as cap

pytestmark = pytest.mark.usefixtures("clean_store")


@pytest.fixture
def bound_heavy(broker_redis: redis.Redis) -> Iterator[Callable[..., None]]:
    """Bound the (emptied) heavy queue for this test only."""
    before = app.conf.get("conventions_backpressure")

    def bound(**spec: Any) -> None:
        app.conf.update(conventions_backpressure={"heavy": spec})
        app.__dict__.pop("conventions_settings", None)
        backpressure.gauge.forget()

    broker_redis.delete("heavy")
    yield bound
    app.conf.update(conventions_backpressure=before)
    app.__dict__.pop("conventions_settings", None)
    backpressure.gauge.forget()
    broker_redis.delete("heavy")


def test_the_publish_that_crosses_the_depth_bound_raises_and_nothing_accepted_is_lost(
    bound_heavy: Callable[..., None],
    broker_redis: redis.Redis,
    worker_process: Callable[..., Any],
) -> None:
    bound_heavy(max_depth=20)
    accepted = [cap.quick.delay(call_id=f"bp{n:02d}") for n in range(20)]
    with pytest.raises(QueueOverCapacity, match=r"queue 'heavy' is over capacity") as caught:
        cap.quick.delay(call_id="bp_over")
    assert caught.value.queue == "heavy"
    assert broker_redis.llen("heavy") == 20
    worker_process("drain", "heavy", concurrency=2, include=cap.__name__)
    assert sorted(r.get(timeout=60) for r in accepted) == [f"bp{n:02d}" for n in range(20)]
    backpressure.gauge.forget()  # refused, not reserved: it goes once there is room
    assert cap.quick.delay(call_id="bp_over").get(timeout=30) == "bp_over"


def test_a_duplicate_of_an_accepted_job_is_not_refused(
    bound_heavy: Callable[..., None],
) -> None:
    bound_heavy(max_depth=1)
    first = cap.quick.delay(call_id="dup_1")
    again = cap.quick.delay(call_id="dup_1")
    assert isinstance(again, DuplicateResult) and again.id == first.id


def test_a_shedding_task_drops_the_job_with_an_audit_event_past_the_age_bound(
    bound_heavy: Callable[..., None], broker_redis: redis.Redis
) -> None:
    bound_heavy(max_age=1)
    cap.quick_shed.delay(call_id="old_1")
    time.sleep(1.0 + backpressure.READING_TTL)
    with bind() as trace:
        result = cap.quick_shed.delay(call_id="new_1")
    assert result.shed is True
    assert broker_redis.llen("heavy") == 1
    with pytest.raises(QueueOverCapacity, match="shed"):
        result.get()
    with pytest.raises(QueueOverCapacity), bind(correlation_id=trace.correlation_id):
        cap.quick.delay(call_id="raise_1")  # a "raise" task on the same queue
    events = app.store.audit_for(trace.correlation_id)
    assert [(e.event, e.task_id) for e in events[-2:]] == [("shed", result.id), ("refused", ANY)]
