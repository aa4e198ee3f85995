"""Locks, progress and checkpoints against the real store (Redis), and exclusive jobs
through a real (thread) worker."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from conventions import bind
from conventions.capacity.locks import lease_name, mutex
from conventions.errors import LockBusy, TransientError
from conventions.observability.progress import Checkpoint, Progress, read_progress
from conventions.store import keys
from tasks import app
from tests.acceptance import support_lifecycle as jobs
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")


def test_a_busy_mutex_raises_lock_busy_naming_the_holder_and_frees_on_exit() -> None:
    store = app.store
    with mutex(store, "customer:cus_0001", ttl=5) as owner:
        with pytest.raises(LockBusy, match=owner) as busy, mutex(store, "customer:cus_0001"):
            pytest.fail("entered a held lock")
        assert isinstance(busy.value, TransientError)  # in a job: retried with backoff
        assert busy.value.holder == owner
    with mutex(store, "customer:cus_0001", ttl=5):
        pass


def test_a_mutex_waits_for_a_crashed_holder_whose_lease_runs_out() -> None:
    store = app.store
    assert store.acquire(lease_name("report:2031"), "crashed-process", 1.0) is None
    started = time.monotonic()
    with mutex(store, "report:2031", ttl=5, wait=10):
        waited = time.monotonic() - started
    assert 0.5 < waited < 5


def test_a_held_mutex_is_renewed_past_its_ttl_while_the_block_runs() -> None:
    store = app.store
    with mutex(store, "long:section", ttl=0.6) as owner:
        time.sleep(1.5)
        assert store.lease_holder(lease_name("long:section")) == owner
    assert store.lease_holder(lease_name("long:section")) is None


def test_progress_never_goes_backwards_even_for_a_resumed_run_that_reports_less() -> None:
    published: list[dict[str, Any]] = []
    first = Progress(app.store, "reports.x.v1", "job-1", publish=published.append, every=0)
    first.report(600, 1000, "chunk 6")
    resumed = Progress(app.store, "reports.x.v1", "job-1", every=0)  # a new delivery
    assert resumed.report(500, 1000, "resumed")["done"] == 600
    assert read_progress(app.store, "job-1") == {
        **read_progress(app.store, "job-1"),  # type: ignore[dict-item]
        "done": 600, "total": 1000, "percent": 60.0, "note": "resumed",
    }  # fmt: skip
    assert published[0]["done"] == 600


def test_progress_writes_are_throttled_but_the_last_one_always_lands() -> None:
    progress = Progress(app.store, "reports.x.v1", "job-2", every=60)
    progress.report(1, 100)
    progress.report(50, 100)
    assert read_progress(app.store, "job-2")["done"] == 1  # type: ignore[index]
    progress.report(100, 100)
    assert read_progress(app.store, "job-2")["done"] == 100  # type: ignore[index]


def test_a_checkpoint_is_saved_read_and_cleared_under_the_idempotency_key(
    store_redis: redis.Redis,
) -> None:
    checkpoint = Checkpoint(app.store, "daily-sales:2031-01-01", keep=60)
    assert checkpoint.load() is None
    checkpoint.save({"after": "ord_0500", "done": 500})
    assert Checkpoint(app.store, "daily-sales:2031-01-01", keep=60).load() == {
        "after": "ord_0500",
        "done": 500,
    }
    assert 0 < store_redis.pttl(keys.state("checkpoint:daily-sales:2031-01-01")) <= 60_000
    checkpoint.clear()
    assert checkpoint.load() is None


def test_exclusive_jobs_of_one_customer_never_overlap_and_other_customers_run_alongside(
    thread_worker: Any, store_redis: redis.Redis
) -> None:
    results = [
        jobs.one_per_customer.delay(customer_id=customer, call_id=f"{customer}_{n}")
        for n in range(3)
        for customer in ("cus_a", "cus_b")
    ]
    assert sorted(r.get(timeout=60) for r in results) == sorted(
        f"{c}_{n}" for n in range(3) for c in ("cus_a", "cus_b")
    )
    spans: dict[str, list[tuple[float, float]]] = {}
    starts: dict[str, float] = {}
    for line in store_redis.lrange(jobs.EXCLUSIVE_LOG, 0, -1):
        event, customer, call, at = line.split()
        if event == "start":
            starts[call] = float(at)
        else:
            spans.setdefault(customer, []).append((starts.pop(call), float(at)))
    for customer, runs in spans.items():
        runs.sort()
        assert len(runs) == 3
        for (_, end), (start, _) in itertools.pairwise(runs):
            assert end <= start, f"two jobs of {customer} ran at once"
    assert store_redis.keys(keys.lease("lock:*")) == []  # every lock released


def test_a_mutex_from_code_and_an_exclusive_job_share_one_lock(
    thread_worker: Any, store_redis: redis.Redis
) -> None:
    story = uuid.uuid4().hex
    with mutex(app.store, "customer:cus_c", ttl=5):
        with bind(correlation_id=story):
            job = jobs.one_per_customer.delay(customer_id="cus_c", call_id="cus_c_locked")
        deferred = wait_for(lambda: [e for e in app.store.audit_for(story)
                                     if e.event == "deferred"], timeout=20)  # fmt: skip
        assert "exclusive lock" in deferred[0].detail["reason"]
        assert store_redis.llen(jobs.EXCLUSIVE_LOG) == 0  # deferred while the lock is held
    assert job.get(timeout=30) == "cus_c_locked"


def test_two_threads_with_one_mutex_take_turns() -> None:
    inside = threading.Semaphore(1)
    overlaps: list[str] = []

    def work() -> None:
        with mutex(app.store, "turns", ttl=5, wait=20, poll=0.02):
            if not inside.acquire(blocking=False):
                overlaps.append("overlap")
            time.sleep(0.05)
            inside.release()

    threads = [threading.Thread(target=work) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert overlaps == []
