"""Test-only jobs for the hostile-envelope tests: one runs until the test releases it,
so that a worker can be killed while it holds the job's message; one takes its key from
free text, so that a producer's newline or NUL reaches the key. Imported by those tests'
workers through ``--include``, never by the reference app itself."""

from __future__ import annotations

import logging
import time
from typing import cast

import redis

from conventions import JobContext, Payload
from tasks import app
from tests.integration.support_jobs import Call

#: Redis keys (in the layer's store database) that the job writes or reads for the test
HELD_RUNS = "test:hostile-held:runs:"
RELEASE = "test:hostile-held:release:"
#: the longest the job waits for its release (below the email lane's soft time limit)
HELD_LIMIT = 45.0


@app.job("testing.held.v1", payload=Call, key="held:{call_id}", workload="email")
def held(payload: Call, ctx: JobContext) -> str:
    """Count the run, then wait for the test's release (at most ``HELD_LIMIT``)."""
    client = cast(redis.Redis, app.store.client)
    client.incr(HELD_RUNS + payload.call_id)
    deadline = time.monotonic() + HELD_LIMIT
    while not client.exists(RELEASE + payload.call_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    return payload.call_id


class Note(Payload):
    """Free text, as a producer wrote it."""

    text: str


@app.job("testing.noted.v1", payload=Note, key="noted:{text}", workload="email")
def noted(payload: Note, ctx: JobContext) -> str:
    """Log the key it runs under (from the text), at warning level."""
    logging.getLogger("tests.hostile").warning("noted under %s", ctx.idempotency_key)
    return ctx.idempotency_key
