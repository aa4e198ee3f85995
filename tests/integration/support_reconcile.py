"""A test-only job with an uncertain outcome and a reconcile step: ``testing.uncertain.v1``.

Its first attempt "calls the provider" (``INCR cc-test:effect:<id>``) and then raises
``UncertainOutcomeError``, like a call that timed out after the request left. When the
flag ``cc-test:lost:<id>`` exists, the call got lost on the way: no effect is recorded.
Later attempts record the effect and return ``"charged"``. ``reconcile`` asks the
"provider" whether the effect happened. Every step is appended to ``cc-test:steps:<id>``,
so that a test sees what ran, on which attempt, in which order.

The keys live in the broker's Redis database. Import this module before the worker
starts: it registers the task on the reference app.
"""

from __future__ import annotations

import redis

from conventions import Backoff, Id, JobContext, Payload, UncertainOutcomeError
from tasks import app


class UncertainCall(Payload):
    """Which call to make."""

    call_id: Id


def effect_key(call_id: str) -> str:
    return f"cc-test:effect:{call_id}"


def lost_key(call_id: str) -> str:
    return f"cc-test:lost:{call_id}"


def steps_key(call_id: str) -> str:
    return f"cc-test:steps:{call_id}"


def keys_of(call_id: str) -> list[str]:
    """Every key this job and its tests use for ``call_id``."""
    return [effect_key(call_id), lost_key(call_id), steps_key(call_id)]


def flags() -> redis.Redis:
    """A client on the broker's Redis database, where the keys live."""
    return redis.Redis.from_url(str(app.conf.broker_url), decode_responses=True)


def reconcile(payload: UncertainCall, ctx: JobContext) -> bool:
    """True when the provider already has the effect: the job is then done."""
    with flags() as client:
        happened = int(client.get(effect_key(payload.call_id)) or 0) > 0
        found = "found" if happened else "missing"
        client.rpush(steps_key(payload.call_id), f"reconcile:{ctx.attempt}:{found}")
    return happened


@app.job(
    "testing.uncertain.v1",
    payload=UncertainCall,
    key="uncertain:{call_id}",
    workload="email",
    backoff=Backoff(base=0.1, cap=1, max_attempts=5),
    reconcile=reconcile,
)
def uncertain(payload: UncertainCall, ctx: JobContext) -> str:
    with flags() as client:
        client.rpush(steps_key(payload.call_id), f"body:{ctx.attempt}")
        if ctx.attempt == 1:
            if not client.exists(lost_key(payload.call_id)):
                client.incr(effect_key(payload.call_id))
            raise UncertainOutcomeError("the provider timed out after the request left")
        client.incr(effect_key(payload.call_id))
    return "charged"
