"""Test-only jobs for the worker lifecycle tests: one that ignores ``is_stopping()``
(so the shutdown grace has to cancel it), one that is exclusive per customer.

Imported by the lifecycle tests and by their worker subprocesses (``--include``).
"""

from __future__ import annotations

import time
from typing import cast

import redis

from conventions import JobContext, Payload
from tasks import app
from tests.integration.support_jobs import Call

#: Redis keys (in the store database) these jobs write or read for the test
STUBBORN_RUNS = "test:stubborn:runs:"
STUBBORN_SAW_STOP = "test:stubborn:saw-stop:"
STUBBORN_RELEASE = "test:stubborn:release:"
EXCLUSIVE_LOG = "test:exclusive:log"
#: the longest the stubborn job runs (below the email lane's soft time limit)
STUBBORN_LIMIT = 45.0


class CustomerCall(Payload):
    customer_id: str
    call_id: str


def _redis() -> redis.Redis:
    return cast(redis.Redis, app.store.client)


@app.job("testing.stubborn.v1", payload=Call, key="stubborn:{call_id}", workload="email")
def stubborn(payload: Call, ctx: JobContext) -> str:
    """Run until released, noting (but ignoring) the worker's shutdown."""
    client = _redis()
    client.incr(STUBBORN_RUNS + payload.call_id)
    deadline = time.monotonic() + STUBBORN_LIMIT
    while not client.exists(STUBBORN_RELEASE + payload.call_id):
        if ctx.is_stopping():
            client.set(STUBBORN_SAW_STOP + payload.call_id, "1")
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return "released"


@app.job(
    "testing.one_per_customer.v1",
    payload=CustomerCall,
    key="one-per-customer:{call_id}",
    workload="email",
    exclusive="customer:{customer_id}",
)
def one_per_customer(payload: CustomerCall, ctx: JobContext) -> str:
    """Hold the customer's lock for a moment, logging when it starts and ends."""
    client = _redis()
    client.rpush(EXCLUSIVE_LOG, f"start {payload.customer_id} {payload.call_id} {time.time()}")
    time.sleep(0.4)
    client.rpush(EXCLUSIVE_LOG, f"end {payload.customer_id} {payload.call_id} {time.time()}")
    return payload.call_id
