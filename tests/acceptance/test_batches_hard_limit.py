"""A batch member killed by its hard time limit, on a real prefork worker: its dead
letter (written in the worker's main process) ends it in its batch, so ``on_complete``
runs once with it failed, and its replay (the fault fixed) fires ``on_success`` once."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from conventions.ops.replay import replay
from conventions.store.records import Category
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

INCLUDE = "tests.integration.support_jobs,tests.integration.support_batches"


def test_a_member_killed_by_its_hard_time_limit_ends_its_batch_and_its_replay_fires_on_success(
    worker_process: Callable[..., Any],
) -> None:
    worker_process("hardlimit", "email", concurrency=2, include=INCLUDE)
    key = f"hard-limit-{uuid.uuid4().hex[:8]}"
    hang = f"{key}-hang"
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in range(3):
        batch.add(jobs.batch_item, item_id=f"{key}-{n}")
    batch.add(jobs.batch_hang, item_id=hang)
    batch.submit()

    # the member hangs past its soft limit (1 s) and is killed at its hard limit (3 s)
    (complete,) = wait_for(lambda: jobs.runs(key), timeout=90, every=0.5)
    assert complete["which"] == "on_complete"
    assert (complete["pending"], complete["succeeded"], complete["failed"]) == (0, 3, 1)
    (dead_id,) = complete["dead"]  # type: ignore[misc]
    record = app.store.get_dead_letter(str(dead_id))
    assert record is not None
    assert record.category is Category.BUG
    assert "hard time limit" in record.message
    assert record.idempotency_key == f"testing.batch_hang:batch-hang:{hang}"

    app.store.put_state(jobs.FIXED + hang, {"fixed": True}, ttl=600)
    replay(app, str(dead_id), reason="fixed: honours its soft limit", actor="test")
    runs = wait_for(lambda: (r := jobs.runs(key)) and len(r) >= 2 and r, timeout=90, every=0.5)
    assert [run["which"] for run in runs] == ["on_complete", "on_success"]
    assert (runs[1]["pending"], runs[1]["succeeded"], runs[1]["failed"]) == (0, 4, 0)
    status = wait_for(
        lambda: (s := app.store.get_batch(key)) and {*s.callback_states.values()} == {"sent"} and s
    )
    assert (status.succeeded, status.failed, status.dead_letter_ids) == (4, 0, [])
    assert len(jobs.runs(key)) == 2  # each callback ran once
