"""Test-only jobs for the clock tests (``tests/integration/test_clock_skew.py``,
``tests/acceptance/test_chaos_clock.py``): each run of one is stamped with the **Redis
server's clock**, the correct one, whatever the clock of the worker that ran it.

Imported by those tests and by their worker subprocesses (through ``--include``), never
by the reference app itself.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, cast

import redis
from celery import current_task, signals

from conventions import JobContext
from conventions.tracing import headers as hdr
from tasks import app
from tasks.payments import ApplyEvent

#: Redis list (in the layer's store database) of each run of an event's job: JSON
#: ``[started on the Redis clock, the worker's node name, ended on the Redis clock or null]``
RUNS = "test:clock:runs:"
#: Redis list of each delivery of a task id to a worker: JSON ``[received on the Redis
#: clock, the worker's node name, the message's cc_due or null]``
RECEIVED = "test:clock:received:"
#: a job of an event whose key exists runs until this key is set (at most HOLD_LIMIT)
HOLD = "test:clock:hold:"
RELEASE = "test:clock:release:"
HOLD_LIMIT = 60.0


def _redis() -> redis.Redis:
    return cast(redis.Redis, app.store.client)


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1_000_000


@app.job("testing.stamp_run.v1", payload=ApplyEvent, key="stamp-run:{event_id}", workload="email")
def stamp_run(payload: ApplyEvent, ctx: JobContext) -> str:
    """Record the moment it starts on the Redis clock; when the test asked to hold this
    event's job, run until released (a long job); then record the end."""
    client = _redis()
    started = redis_now(client)
    who = str(current_task.request.hostname or f"{socket.gethostname()}:{os.getpid()}")
    index = client.rpush(RUNS + payload.event_id, json.dumps([started, who, None])) - 1
    if client.exists(HOLD + payload.event_id):
        deadline = time.monotonic() + HOLD_LIMIT
        while not client.exists(RELEASE + payload.event_id) and time.monotonic() < deadline:
            time.sleep(0.05)
    client.lset(RUNS + payload.event_id, index, json.dumps([started, who, redis_now(client)]))
    return "stamped"


@signals.task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    """Each delivery of a stamp job, timed on the Redis clock as the worker receives it
    (its main process): how many deliveries a job had, where and when."""
    if request is None or request.task_name != stamp_run.name:
        return
    client = _redis()
    due = (request.message.headers or {}).get(hdr.DUE)
    record = [redis_now(client), str(request.hostname), due]
    client.rpush(RECEIVED + str(request.id), json.dumps(record))


def received(client: redis.Redis) -> dict[str, list[tuple[float, str, str | None]]]:
    """Task id -> its deliveries (received on the Redis clock, node name, cc_due), in
    time order."""
    found = {}
    for key in client.scan_iter(RECEIVED + "*"):
        rows = [tuple(json.loads(raw)) for raw in client.lrange(key, 0, -1)]
        found[key.decode().removeprefix(RECEIVED)] = sorted(rows)
    return found  # type: ignore[return-value]


def runs(client: redis.Redis, event_id: str) -> list[tuple[float, str, float | None]]:
    """Each run of the event's job: started and ended (Redis clock), and where."""
    return [tuple(json.loads(raw)) for raw in client.lrange(RUNS + event_id, 0, -1)]  # type: ignore[misc]
