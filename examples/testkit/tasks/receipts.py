"""The receipt of an order: one e-mail per order, however often the job runs."""

from __future__ import annotations

from conventions import Backoff, Id, JobContext, Payload

from tasks import app
from tasks.mailer import MailboxUnknown, Unavailable, mailer


class Receipt(Payload):
    """Ids only: the job looks the rest up."""

    order_id: Id
    customer_id: Id


@app.job(
    "shop.send_receipt.v1",
    payload=Receipt,
    key="receipt:{order_id}",  # one receipt per order
    workload="email",
    errors={Unavailable: "transient", MailboxUnknown: "permanent"},
    backoff=Backoff(base=2.0, cap=60.0, max_attempts=5),
)
def send_receipt(payload: Receipt, ctx: JobContext) -> str:
    mailer.send(payload.customer_id, "receipt", idempotency_key=ctx.idempotency_key)
    return ctx.idempotency_key
