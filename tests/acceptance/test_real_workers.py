"""Whole scenarios through real ``celery -A tasks worker`` processes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from conventions.store.records import Category
from tasks import app, db, shop
from tasks.receipts import send_receipt
from tasks.reports import daily_sales
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, wait_for

pytestmark = pytest.mark.usefixtures("clean_store")


def test_a_worker_on_email_and_heavy_answers_ping_and_runs_a_job_from_each_queue(
    worker_process: Callable[..., Any],
) -> None:
    worker_process("both", "email,heavy")
    # "ready" is logged before the worker's loop subscribes to the broadcast channel, and
    # a broadcast sent before that is lost (Redis pub/sub): ping until it answers (a
    # loaded machine's loop starts later; seen in a clean-clone run: no reply in 5 s)
    replies = wait_for(
        lambda: app.control.ping(destination=[f"both@{_host()}"], timeout=1), timeout=30
    )
    assert "ok" in str(replies)
    assert send_receipt.delay(order_id="ord_0005").get(timeout=30) in ("sent", "already sent")
    # the day the session seeded its orders on, not today: a run that crosses midnight
    # UTC would ask for a day with none
    report = daily_sales.delay(business_date=_seeded_day()).get(timeout=60)
    assert report["orders"] >= 1


def test_a_worker_on_email_only_does_not_run_heavy_jobs(
    worker_process: Callable[..., Any], broker_redis: Any
) -> None:
    broker_redis.delete("heavy")
    worker_process("light", "email")
    heavy = daily_sales.delay(business_date=dt.date(2026, 1, 2))
    light = support_jobs.echo.delay(call_id="light_lane")
    assert light.get(timeout=30)["call_id"] == "light_lane"
    assert heavy.state == "PENDING"
    assert broker_redis.llen("heavy") == 1
    broker_redis.delete("heavy")


def test_a_job_that_kills_its_worker_is_quarantined_as_poison_and_others_complete(
    worker_process: Callable[..., Any],
) -> None:
    worker_process("poison", "email", concurrency=2)
    bad = support_jobs.crash.delay(call_id="kills_1")
    others = [support_jobs.echo.delay(call_id=f"meanwhile_{n}") for n in range(10)]
    assert all(r.get(timeout=60)["call_id"].startswith("meanwhile_") for r in others)
    record = wait_for(lambda: dead_letter_of(bad.id), timeout=90, every=0.5)
    assert record.category is Category.POISON
    assert "keeps killing its worker" in record.message
    with pytest.raises(Exception, match="keeps killing its worker"):
        bad.get(timeout=30)  # a final state, not STARTED forever
    assert support_jobs.echo.delay(call_id="after_poison").get(timeout=30)


def _seeded_day() -> dt.date:
    with db.transaction() as session:
        first = session.execute(select(func.min(shop.Order.created_at))).scalar_one()
    return first.astimezone(dt.UTC).date()


def _host() -> str:
    import socket

    return socket.gethostname()


def test_a_job_killed_by_its_hard_time_limit_is_dead_lettered_and_frees_its_key(
    worker_process: Callable[..., Any],
) -> None:
    worker_process("stuck", "email", concurrency=1)
    first = support_jobs.stuck.delay(call_id="hang_1")
    record = wait_for(lambda: dead_letter_of(first.id), timeout=60, every=0.5)
    assert record.category is Category.BUG
    assert "hard time limit" in record.message
    assert record.idempotency_key == "testing.stuck:stuck:hang_1"
    again = support_jobs.stuck.delay(call_id="hang_1")  # the reservation was dropped
    assert again.deduplicated is False
    # it runs, and is killed, too: nothing of this test is left queued for the next file
    assert wait_for(lambda: dead_letter_of(again.id), timeout=60, every=0.5).category is (
        Category.BUG
    )
