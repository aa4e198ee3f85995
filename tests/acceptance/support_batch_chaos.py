"""The jobs of the batch chaos run, and its submitter and replayer process.

Imported by the chaos workers (``--include``) and run as ``python -m
tests.acceptance.support_batch_chaos submit|replay <batch key> ...`` in the environment
of :func:`tests.acceptance.support_chaos.worker_env` (the chaos Redis: broker in db 0, the
store in db 1). Each callback run is recorded in db 2 of the same server (AOF, fsync
always), with what the batch said when it ran.
"""

from __future__ import annotations

import json
import os
import sys
import time

import redis

from conventions import Id, JobContext, Payload, PermanentError
from tasks import app

#: the list each callback run is recorded in: ``<prefix><batch id>``
RUNS = "chaos-batch-runs:"
#: how many times each member's body ran (a hash: item -> count)
BODIES = "chaos-batch-bodies:"
FIXED = "chaos-batch-fixed:"


def recorder() -> redis.Redis:
    url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/2"
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)


class Item(Payload):
    item_id: Id


class Done(Payload):
    batch_id: Id


@app.job("chaos.batch_item.v1", payload=Item, key="chaos-batch:{item_id}", workload="email")
def batch_item(payload: Item, ctx: JobContext) -> str:
    recorder().hincrby(BODIES + "all", payload.item_id, 1)
    time.sleep(0.005)
    if payload.item_id.startswith("bad") and app.store.get_state(FIXED + payload.item_id) is None:
        raise PermanentError(f"{payload.item_id} is bad")
    return "ok"


def _record(which: str, batch_id: str) -> str:
    status = app.store.get_batch(batch_id)
    assert status is not None
    entry = {
        "which": which, "pending": status.pending, "succeeded": status.succeeded,
        "failed": status.failed, "dead": len(status.dead_letter_ids),
        "ended_members": sum(1 for state, _, _ in status.members.values() if state != "p"),
        "total": status.total,
    }  # fmt: skip
    recorder().rpush(RUNS + batch_id, json.dumps(entry))
    return which


@app.job("chaos.batch_success.v1", payload=Done, key="chaos-success:{batch_id}", workload="email")
def batch_success(payload: Done, ctx: JobContext) -> str:
    return _record("on_success", payload.batch_id)


@app.job("chaos.batch_complete.v1", payload=Done, key="chaos-complete:{batch_id}", workload="email")
def batch_complete(payload: Done, ctx: JobContext) -> str:
    return _record("on_complete", payload.batch_id)


def submit(key: str, count: int, bad: int) -> None:
    batch = app.batch(key, on_success=batch_success.s(), on_complete=batch_complete.s())
    for n in range(count - bad):
        batch.add(batch_item, item_id=f"{key}-{n:05d}")
    for n in range(bad):
        batch.add(batch_item, item_id=f"bad-{key}-{n:03d}")
    print(f"submitted {batch.submit()}", flush=True)


def replay_all(key: str) -> None:
    from conventions.ops.replay import replay

    status = app.store.get_batch(key)
    assert status is not None
    for name, (_, _, _) in status.members.items():
        if name.rpartition(":")[2].startswith("bad-"):
            app.store.put_state(FIXED + name.rpartition(":")[2], {"fixed": True}, ttl=3600)
    for record_id in status.dead_letter_ids:
        replay(app, record_id, reason="fixed", actor="chaos")
    print(f"replayed {len(status.dead_letter_ids)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "submit":
        submit(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        replay_all(sys.argv[2])
