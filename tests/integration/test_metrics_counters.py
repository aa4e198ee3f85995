"""The exporter's counters match a scripted run, read from a real scrape.

Jobs are published while no worker runs (so duplicates are certain), then a real prefork
worker runs them: successes, retries, exhausted retries, a permanent failure, a bug, a
skip and a delivery of a key already done. Every counter the endpoint shows must equal
what the script makes happen, exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from conventions.observability import audit, queues
from tasks import app
from tests.integration import support_metrics
from tests.integration.exporter import ExporterProcess, Scrape
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

METERED = "testing.metered.v1"


@pytest.fixture(scope="module")
def exporter(services: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExporterProcess]:
    log = tmp_path_factory.mktemp("exporter") / "exporter.log"
    lag = "tests.integration.support_metrics:outbox_lag"
    with ExporterProcess("tests.integration.support_metrics:app", log, "--outbox-lag", lag) as p:
        yield p


def _jobs(scrape: Scrape) -> dict[str, float]:
    """The non-zero counters of the metered task (queue ``email``), by metric noun."""
    prefix, suffix = "celery_conventions_", "_total"
    return {
        name.removeprefix(prefix).removesuffix(suffix): value
        for (name, queue, task), value in scrape.items()
        if task == METERED and queue == "email" and name.endswith(suffix) and value
    }


def _finished() -> int:
    """How many metered jobs reached their final outcome (the store's counters)."""
    final = ("succeeded", "skipped", "skipped_duplicate")
    return sum(
        value
        for (name, task), value in app.store.counters().items()
        if task == METERED and (name in final or name.startswith("dead_lettered:"))
    )


def test_the_scraped_counters_match_a_scripted_run_exactly(
    exporter: ExporterProcess, broker_redis: redis.Redis, worker_process: Callable[..., Any]
) -> None:
    with queues.from_app(app) as reader:
        broker_redis.delete(*[key for queue in reader.queues for key in reader.lists(queue)])
    metered = support_metrics.metered
    for n in range(5):
        metered.delay(item_id=f"ok_{n}")
    duplicates = [metered.delay(item_id="ok_0") for _ in range(2)]
    assert all(handle.deduplicated for handle in duplicates)
    metered.delay(item_id="flaky", fails=2)  # two retries, then success
    metered.delay(item_id="tired", fails=9)  # three attempts, dead-lettered as exhausted
    metered.delay(item_id="refused", mode="permanent")
    metered.delay(item_id="defect", mode="bug")
    metered.delay(item_id="idle", mode="skip")
    audit.record(app.store, "watchdog_alarm", METERED, "watchdog-1", {})

    worker_process("metered", "email", concurrency=2, include="tests.integration.support_metrics")
    wait_for(lambda: _finished() == 10, timeout=90)
    metered.delay(item_id="ok_0")  # the key is done: this delivery is skipped
    wait_for(lambda: _finished() == 11, timeout=60)

    scrape = exporter.scrape()
    assert _jobs(scrape) == {
        "jobs_published": 11,
        "jobs_deduplicated": 2,
        "jobs_started": 5 + 3 + 3 + 1 + 1 + 1,
        "jobs_retried": 2 + 2,
        "jobs_succeeded": 5 + 1,
        "jobs_skipped": 1,
        "jobs_skipped_duplicate": 1,
        "jobs_dead_lettered": 3,
        "watchdog_alarms": 1,
    }
    assert scrape["celery_conventions_dead_letters", "", ""] == 3
    for histogram in ("job_wait_seconds", "job_run_seconds"):
        count = scrape[f"celery_conventions_{histogram}_count", "email", METERED]
        inf = scrape[f"celery_conventions_{histogram}_bucket{{le=+Inf}}", "email", METERED]
        assert count == inf == 14  # one observation per start, one per body run
        assert scrape[f"celery_conventions_{histogram}_sum", "email", METERED] >= 0
    assert scrape["celery_conventions_store_up", "", ""] == 1


def test_the_outbox_lag_is_exported_when_the_outbox_reports_one(
    exporter: ExporterProcess, broker_redis: redis.Redis
) -> None:
    broker_redis.delete(support_metrics.OUTBOX_LAG_KEY)
    names = {name for name, _, _ in exporter.scrape()}
    assert "celery_conventions_outbox_lag_seconds" not in names  # no outbox: no metric
    broker_redis.set(support_metrics.OUTBOX_LAG_KEY, "42.5")
    try:
        assert exporter.scrape()["celery_conventions_outbox_lag_seconds", "", ""] == 42.5
    finally:
        broker_redis.delete(support_metrics.OUTBOX_LAG_KEY)
