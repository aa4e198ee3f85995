"""A test-only task whose outcome the payload scripts, for the metrics tests.

``testing.metered.v1`` fails with a ``TransientError`` on its first ``fails`` attempts
(retried after a few milliseconds, 3 attempts in all), then ends as ``mode`` says:
``ok`` returns, ``permanent`` and ``bug`` are dead-lettered, ``skip`` is skipped. The
outcome is a function of the payload alone, so a run's counts are known in advance.
Import this module before the worker starts: it registers the task on the reference app.
"""

from __future__ import annotations

from typing import Any, Literal

import redis

from conventions import Backoff, Id, JobContext, Payload, PermanentError, SkipJob, TransientError
from tasks import app

#: quick retries: the whole scripted run takes seconds
QUICK = Backoff(base=0.05, cap=0.2, max_attempts=3)
#: the broker-database key the outbox-lag stand-in reads (seconds, or absent)
OUTBOX_LAG_KEY = "cc-test:outbox-lag"


class Metered(Payload):
    item_id: Id
    mode: Literal["ok", "permanent", "bug", "skip"] = "ok"
    fails: int = 0


@app.job("testing.metered.v1", payload=Metered, key="metered:{item_id}", workload="email",
         backoff=QUICK)  # fmt: skip
def metered(payload: Metered, ctx: JobContext) -> str:
    if ctx.attempt <= payload.fails:
        raise TransientError(f"attempt {ctx.attempt} of {payload.item_id} fails as scripted")
    if payload.mode == "permanent":
        raise PermanentError(f"{payload.item_id} is refused for good")
    if payload.mode == "bug":
        raise TypeError(f"a defect in {payload.item_id}")
    if payload.mode == "skip":
        raise SkipJob(f"{payload.item_id} has nothing to do")
    return "ok"


def outbox_lag(app: Any) -> float | None:
    """A stand-in for the outbox's lag reader (``--outbox-lag``): the broker-database key
    :data:`OUTBOX_LAG_KEY`, or None (no outbox) when it is absent."""
    with redis.Redis.from_url(str(app.conf.broker_url), decode_responses=True) as client:
        value = client.get(OUTBOX_LAG_KEY)
    return None if value is None else float(value)
