"""Batches with the store on a Redis Cluster (three masters of the session's own), run
by a real ``celery`` worker: a nested batch and its parent call back once each after
every member ended, a failed member's replay fires ``on_success`` once, and so does a
member killed by its hard time limit (its dead letter written by the worker's main
process); every member's keys were in its batch tree's slot (``keys.batch_home``), so
each end was one script."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conventions.ops.replay import replay
from conventions.store import RedisStore, keys
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration import support_cluster
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

INCLUDE = "tests.integration.support_jobs,tests.integration.support_batches"


@pytest.fixture
def cluster_store(redis_cluster: support_cluster.Cluster) -> Iterator[str]:
    """The app's store on the cluster (the default prefix: the contract suite's stores
    there use prefixes of their own), in this process and (by its URL) in the worker's."""
    url = support_cluster.url(redis_cluster.ports)
    store = RedisStore(url)
    previous = app.__dict__.get("_cc_store")
    app.__dict__["_cc_store"] = store
    _wipe(store)
    try:
        yield url
    finally:
        app.__dict__["_cc_store"] = previous
        _wipe(store)
        store.close()


def _wipe(store: RedisStore) -> None:
    for key in store.client.scan_iter(match=keys.pattern(store.prefix), count=1000):
        store.client.delete(key)  # on a cluster, SCAN visits every master


def test_nested_batches_on_a_cluster_store_call_back_once_and_a_replay_fires_on_success(
    worker_process: Callable[..., Any], cluster_store: str
) -> None:
    levels = os.environ.get("CONVENTIONS_DOCTOR_LEVELS", "")
    worker_process(
        "cluster", "email", concurrency=2, include=INCLUDE, CONVENTIONS_STORE_URL=cluster_store,
        # the test's cluster has no replicas (the chaos run's has)
        CONVENTIONS_DOCTOR_LEVELS=f"{levels},cluster-master-without-replica=warning",
    )  # fmt: skip
    outer, inner = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("outer", "inner"))
    bad = f"bad-{inner}"
    parent = app.batch(
        outer, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s()
    )
    for n in range(6):
        parent.add(jobs.batch_item, item_id=f"{outer}-{n}")
    child = parent.batch(inner, on_complete=jobs.batch_complete.s(label="inner"))
    for n in range(4):
        child.add(jobs.batch_item, item_id=f"{inner}-{n}")
    child.add(jobs.batch_item, item_id=bad)
    assert parent.submit().published == 11

    (inner_done,) = wait_for(lambda: jobs.runs(inner), timeout=90, every=0.5)
    assert (inner_done["pending"], inner_done["succeeded"], inner_done["failed"]) == (0, 4, 1)
    (outer_done,) = wait_for(lambda: jobs.runs(outer), timeout=90, every=0.5)
    assert outer_done["which"] == "on_complete"
    assert (outer_done["pending"], outer_done["succeeded"], outer_done["failed"]) == (0, 6, 1)
    (dead_id,) = inner_done["dead"]  # type: ignore[misc]
    assert app.store.get_dead_letter(str(dead_id)) is not None  # found by its id alone

    app.store.put_state(jobs.FIXED + bad, {"fixed": True}, ttl=600)
    replay(app, str(dead_id), reason="fixed", actor="test")
    runs = wait_for(lambda: (r := jobs.runs(outer)) and len(r) >= 2 and r, timeout=90, every=0.5)
    assert [run["which"] for run in runs] == ["on_complete", "on_success"]
    assert (runs[1]["pending"], runs[1]["succeeded"], runs[1]["failed"]) == (0, 7, 0)
    assert len(jobs.runs(inner)) == 1  # the inner batch has no on_success: nothing more
    listed = {status.id for status in app.store.list_batches()}
    assert {outer, inner} <= listed


def test_a_member_killed_by_its_hard_time_limit_ends_its_batch_on_a_cluster_store(
    worker_process: Callable[..., Any], cluster_store: str
) -> None:
    """The dead letter the worker's main process writes is in the batch's slot too."""
    levels = os.environ.get("CONVENTIONS_DOCTOR_LEVELS", "")
    worker_process(
        "cluster-hard", "email", concurrency=2, include=INCLUDE,
        CONVENTIONS_STORE_URL=cluster_store,
        CONVENTIONS_DOCTOR_LEVELS=f"{levels},cluster-master-without-replica=warning",
    )  # fmt: skip
    key = f"cluster-hard-{uuid.uuid4().hex[:8]}"
    hang = f"{key}-hang"
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    batch.add(jobs.batch_item, item_id=f"{key}-0")
    batch.add(jobs.batch_hang, item_id=hang)
    batch.submit()

    (complete,) = wait_for(lambda: jobs.runs(key), timeout=90, every=0.5)
    assert (complete["pending"], complete["succeeded"], complete["failed"]) == (0, 1, 1)
    (dead_id,) = complete["dead"]  # type: ignore[misc]
    record = app.store.get_dead_letter(str(dead_id))
    assert record is not None and "hard time limit" in record.message
    app.store.put_state(jobs.FIXED + hang, {"fixed": True}, ttl=600)
    replay(app, str(dead_id), reason="fixed", actor="test")
    runs = wait_for(lambda: (r := jobs.runs(key)) and len(r) >= 2 and r, timeout=90, every=0.5)
    assert [run["which"] for run in runs] == ["on_complete", "on_success"]
    assert (runs[1]["succeeded"], runs[1]["failed"]) == (2, 0)
