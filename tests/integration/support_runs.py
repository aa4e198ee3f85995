"""A test-only job for the run history: ``testing.runs_retry.v1``.

Its first attempt fails with a ``TransientError`` (retried within a second), its second
returns ``"ok"``; it keeps its log lines in its run record. Import this module before the
worker starts: it registers the job on the reference app.
"""

from __future__ import annotations

import logging

from conventions import Backoff, Id, JobContext, Payload, PermanentError, TransientError
from tasks import app

logger = logging.getLogger("tests.support_runs")
logger.setLevel(logging.INFO)  # kept lines are those the logging config lets through


class RetryPayload(Payload):
    """Which item; ``refuse``: fail for good instead (a dead letter)."""

    item_id: Id
    refuse: bool = False


@app.job(
    "testing.runs_retry.v1", payload=RetryPayload, key="runs-retry:{item_id}",
    workload="email", backoff=Backoff(base=0.1, cap=0.2, jitter=0.0), keep_logs=True,
)  # fmt: skip
def runs_retry(payload: RetryPayload, ctx: JobContext) -> str:
    logger.info("attempt %d of item %s", ctx.attempt, payload.item_id)
    if payload.refuse:
        raise PermanentError(f"item {payload.item_id} is refused")
    if ctx.attempt == 1:
        raise TransientError("the provider timed out")
    return "ok"
