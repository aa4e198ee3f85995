"""A complete convention task (docs/howto/write-a-task.md)."""

from __future__ import annotations

from conventions import Backoff, Id, JobContext, Payload
from examples.howto.app import app
from examples.howto.provider import load_order, provider


class ChargeOrder(Payload):
    """Which order to charge."""

    order_id: Id


class RateLimited(Exception):
    """The provider said 'slow down' in its own way."""


@app.job(
    "payments.charge_order.v1",  # domain.action.vN
    payload=ChargeOrder,  # a conventions.Payload subclass
    key="charge:{order_id}",  # idempotency key template over payload fields
    workload="email",  # a key of conventions_workloads, never a queue
    time_limit=120,  # hard limit, seconds (soft: 108)
    dedup="until_done",  # the default
    replayable=False,  # moves money: replay needs --force
    backoff=Backoff(base=2.0, cap=300.0, max_attempts=6),
    errors={RateLimited: "transient"},  # added in front of the default table
)
def charge_order(payload: ChargeOrder, ctx: JobContext) -> str:
    order = load_order(payload.order_id)  # fresh data, read now
    provider.charge(order, idempotency_key=ctx.idempotency_key)  # same key on every retry
    return "charged"
