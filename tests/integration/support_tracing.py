"""Test-only jobs for the correlation story: a flaky job that fans out, and plain Celery
tasks (no conventions) published from inside a job.

Imported by the tests and by subprocess workers through ``--include``.
"""

from __future__ import annotations

import logging
from typing import Any

from conventions import Backoff, Id, JobContext, Payload, TransientError
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration.support_jobs import echo

logger = logging.getLogger("shop.orders")
FAST = Backoff(base=0.2, cap=1.0, max_attempts=5)


class Order(Payload):
    order_id: Id


@app.job(
    "testing.flaky_fanout.v1", payload=Order, key="fanout:{order_id}", workload="email",
    backoff=FAST,
)  # fmt: skip
def flaky_fanout(payload: Order, ctx: JobContext) -> list[str]:
    """Fails transiently on its first two attempts, then publishes two child jobs."""
    logger.info("attempt %d for order %s", ctx.attempt, payload.order_id)
    if ctx.attempt < 3:
        raise TransientError(f"provider busy (attempt {ctx.attempt})")
    children = [echo.delay(call_id=f"{payload.order_id}-{part}") for part in ("a", "b")]
    logger.info("fanned out %s", [child.id for child in children])
    return [child.id for child in children]


@app.task(name="testing.plain_child")  # type: ignore[untyped-decorator]
def plain_child() -> dict[str, Any]:
    """A plain Celery task: reports the headers it arrived with."""
    from celery import current_task

    request = current_task.request
    return {name: getattr(request, name, None) for name in hdr.ALL_HEADERS}


@app.job("testing.plain_parent.v1", payload=Order, key="plain:{order_id}", workload="email")
def plain_parent(payload: Order, ctx: JobContext) -> str:
    """Publishes a plain Celery task from inside a convention job."""
    return str(plain_child.delay().id)


@app.job("testing.log_error.v1", payload=Order, key="logerr:{order_id}", workload="email")
def log_error(payload: Order, ctx: JobContext) -> None:
    """Logs an error line and succeeds: Sentry's logging integration reports the line."""
    logger.error("the provider refused order %s", payload.order_id)
