"""Test-only jobs for the idempotency acceptance tests: one dies after its business
commit (before the ack), one runs until the test releases it (longer than a short
visibility timeout).

Imported by ``tests/acceptance/test_idempotency.py`` and by its worker subprocesses
(through ``--include``), never by the reference app itself.
"""

from __future__ import annotations

import os
import time
from typing import cast

import redis

from conventions import JobContext
from conventions.transactional.once import once
from tasks import app, db, shop
from tasks.payments import ApplyEvent

#: Redis keys (in the layer's store database) that these jobs write or read for the test
CRASH_RUNS = "test:crash-after-commit:runs:"
FIRST_DELIVERY = "test:crash-after-commit:first:"
SLOW_RUNS = "test:slow-apply:runs:"
RELEASE = "test:slow-apply:release:"
#: the longest a slow job waits for its release (below the email lane's soft time limit)
SLOW_WAIT_LIMIT = 45.0


def _redis() -> redis.Redis:
    return cast(redis.Redis, app.store.client)


def _apply_once(key: str, event_id: str) -> bool:
    """Apply the payment event behind ``once(key)``, in one transaction."""
    with db.transaction() as session:
        applied = once(session, key)
        if applied:
            shop.apply_payment(session, event_id)
    return applied


@app.job(
    "testing.apply_then_crash.v1",
    payload=ApplyEvent,
    key="crash-after-commit:{event_id}",
    workload="email",
)
def apply_then_crash(payload: ApplyEvent, ctx: JobContext) -> str:
    """Apply the payment behind ``once()`` and commit; on the first delivery only, kill
    the worker process before the ledger records "done" and before the ack."""
    _redis().incr(CRASH_RUNS + payload.event_id)
    applied = _apply_once(ctx.idempotency_key, payload.event_id)
    # committed: now die, once, in the window between the commit and the ack
    if _redis().set(FIRST_DELIVERY + payload.event_id, ctx.task_id, nx=True):
        os._exit(1)
    return "applied" if applied else "already applied"


@app.job(
    "testing.slow_apply.v1",
    payload=ApplyEvent,
    key="slow-apply:{event_id}",
    workload="email",
)
def slow_apply(payload: ApplyEvent, ctx: JobContext) -> str:
    """Run until the test sets the release key (at most ``SLOW_WAIT_LIMIT``), then apply
    the payment behind ``once()``."""
    client = _redis()
    client.incr(SLOW_RUNS + payload.event_id)
    deadline = time.monotonic() + SLOW_WAIT_LIMIT
    while not client.exists(RELEASE + payload.event_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    applied = _apply_once(ctx.idempotency_key, payload.event_id)
    return "applied" if applied else "already applied"
