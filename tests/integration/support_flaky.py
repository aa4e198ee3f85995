"""A test-only task for replays that run to success: ``testing.flaky.v1``.

Its body fails with a ``PermanentError`` while the Redis flag ``cc-test:flaky:<id>:broken``
exists (the provider is down), and returns ``"ok"`` once the flag is gone (the provider
was fixed). Import this module before the worker starts: it registers the task on the
reference app.
"""

from __future__ import annotations

import redis

from conventions import Id, JobContext, Payload, PermanentError
from tasks import app


class FlakyPayload(Payload):
    """Which item to process."""

    item_id: Id


def broken_flag(item_id: str) -> str:
    return f"cc-test:flaky:{item_id}:broken"


def flags() -> redis.Redis:
    """A client on the broker's Redis database, where the flags live."""
    return redis.Redis.from_url(str(app.conf.broker_url), decode_responses=True)


@app.job("testing.flaky.v1", payload=FlakyPayload, key="flaky:{item_id}", workload="email")
def flaky(payload: FlakyPayload, ctx: JobContext) -> str:
    with flags() as client:
        if client.exists(broken_flag(payload.item_id)):
            raise PermanentError(f"provider refuses item {payload.item_id}")
    return "ok"
