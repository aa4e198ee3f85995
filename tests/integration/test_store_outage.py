"""A store outage never loses a job: deliveries wait for the store to come back.

The store is a Redis server of this test's own on a spare port, stopped and started
again; the machine's Redis (the broker) is untouched.
"""

from __future__ import annotations

import logging
import time

import pytest

from conventions.store.records import Category
from tasks import app
from tests.integration.helpers import (
    SpareRedis,
    wait_for,
)  # SpareRedis: test_outbox_relay imports it here
from tests.integration.test_worker_contract import _foreign_publish

pytestmark = pytest.mark.usefixtures("services", "thread_worker")


def _deferred_for_the_outage(caplog: pytest.LogCaptureFixture, task_id: str) -> bool:
    """The worker received ``task_id`` while the store was down and put it off."""
    return any(
        task_id in r.getMessage() and "the store is unavailable" in r.getMessage()
        for r in caplog.records
    )


def test_a_job_delivered_while_the_store_is_down_runs_once_it_is_back(
    spare_store: SpareRedis, caplog: pytest.LogCaptureFixture
) -> None:
    spare_store.stop()
    with caplog.at_level(logging.INFO, logger="conventions.worker.delivery"):
        task_id = _foreign_publish("testing.echo.v1", {"call_id": "outage_1"})
        wait_for(lambda: _deferred_for_the_outage(caplog, task_id) or None)
    spare_store.start()
    result = app.AsyncResult(task_id).get(timeout=60)
    assert result["call_id"] == "outage_1"


def test_a_dead_letter_that_cannot_be_written_keeps_the_job_until_it_can(
    spare_store: SpareRedis, caplog: pytest.LogCaptureFixture
) -> None:
    spare_store.stop()
    with caplog.at_level(logging.INFO, logger="conventions.worker.delivery"):
        task_id = _foreign_publish("testing.echo.v1", {"call_id": "bad id during outage"})
        wait_for(lambda: _deferred_for_the_outage(caplog, task_id) or None)
    spare_store.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [r for r in app.store.list_dead_letters() if r.task_id == task_id]
        if found:
            break
        time.sleep(0.2)
    assert found and found[0].category is Category.INVALID
