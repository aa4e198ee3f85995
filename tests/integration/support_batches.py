"""Test-only jobs of a batch on the reference app: a member that fails for good until it
is fixed, and callbacks that record each run, with what the batch said when they ran.

The records go to the broker's Redis (``REDIS_URL``), whichever store the app uses, so a
test reads them the same way on Redis and on SQL.
"""

from __future__ import annotations

import json
import os

import redis

from conventions import Id, JobContext, Payload, PermanentError
from tasks import app

#: the list each callback run is recorded in: ``<prefix><batch id>``
RUNS = "test-batch-runs:"
#: the state record that fixes a failing member (``<prefix><item id>``)
FIXED = "test-batch-fixed:"


def recorder() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)


class Item(Payload):
    item_id: Id


class BatchDone(Payload):
    batch_id: Id
    label: Id = "done"


@app.job("testing.batch_item.v1", payload=Item, key="batch-item:{item_id}", workload="email")
def batch_item(payload: Item, ctx: JobContext) -> str:
    """Fails for good while its id starts with ``bad`` and nothing fixed it."""
    if payload.item_id.startswith("bad") and app.store.get_state(FIXED + payload.item_id) is None:
        raise PermanentError(f"{payload.item_id} is bad")
    return "ok"


@app.job(
    "testing.batch_hang.v1", payload=Item, key="batch-hang:{item_id}", workload="email",
    time_limit=3.0, soft_time_limit=1.0,
)  # fmt: skip
def batch_hang(payload: Item, ctx: JobContext) -> str:
    """Ignores its soft time limit until it is fixed, so the hard limit kills its process."""
    import time

    from celery.exceptions import SoftTimeLimitExceeded

    deadline = time.monotonic() + 30
    while app.store.get_state(FIXED + payload.item_id) is None and time.monotonic() < deadline:
        try:
            time.sleep(0.1)
        except SoftTimeLimitExceeded:
            continue
    return "ok"


def _record(which: str, payload: BatchDone, ctx: JobContext) -> str:
    status = app.store.get_batch(payload.batch_id)
    assert status is not None
    entry = {
        "which": which, "label": payload.label, "task_id": ctx.task_id,
        "pending": status.pending, "succeeded": status.succeeded, "failed": status.failed,
        "dead": status.dead_letter_ids,
        "ended": sum(1 for state, _, _ in status.members.values() if state != "p"),
    }  # fmt: skip
    recorder().rpush(RUNS + payload.batch_id, json.dumps(entry))
    return which


@app.job(
    "testing.batch_success.v1", payload=BatchDone, key="batch-success:{batch_id}",
    workload="email",
)  # fmt: skip
def batch_success(payload: BatchDone, ctx: JobContext) -> str:
    return _record("on_success", payload, ctx)


@app.job(
    "testing.batch_complete.v1", payload=BatchDone, key="batch-complete:{batch_id}",
    workload="email",
)  # fmt: skip
def batch_complete(payload: BatchDone, ctx: JobContext) -> str:
    return _record("on_complete", payload, ctx)


def runs(batch_id: str) -> list[dict[str, object]]:
    """The callback runs of ``batch_id``, in order."""
    return [json.loads(item) for item in recorder().lrange(RUNS + batch_id, 0, -1)]


@app.job(
    "testing.batch_forever.v1", payload=Item, key="batch-forever:{item_id}", workload="email",
    dedup="forever",
)  # fmt: skip
def batch_forever(payload: Item, ctx: JobContext) -> str:
    """A member whose key is never published again once used."""
    return "ok"


@app.job(
    "testing.batch_ttl.v1", payload=Item, key="batch-ttl:{item_id}", workload="email",
    dedup=3600.0,
)  # fmt: skip
def batch_ttl(payload: Item, ctx: JobContext) -> str:
    """A member whose key is not published again for an hour."""
    return "ok"


@app.job(
    "testing.batch_shed.v1", payload=Item, key="batch-shed:{item_id}", workload="heavy",
    overflow="shed",
)  # fmt: skip
def batch_shed(payload: Item, ctx: JobContext) -> str:
    """A member dropped past its queue's bound."""
    return "ok"
