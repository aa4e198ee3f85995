"""``payments.apply_event.v1``: apply a payment webhook event to its order, once.

Webhooks arrive twice, get retried, get replayed: the event id is the idempotency key,
the ``once`` marker commits with the payment, and the receipt goes out as a child job
(which inherits the correlation id and names this job as its cause).
"""

from __future__ import annotations

from conventions import Id, JobContext, Payload, PermanentError
from conventions.transactional.once import once
from tasks import app, db, shop
from tasks.receipts import send_receipt


class ApplyEvent(Payload):
    """Which payment event to apply."""

    event_id: Id


@app.job(
    "payments.apply_event.v1",
    payload=ApplyEvent,
    key="payment-event:{event_id}",
    workload="email",
    replayable=False,  # moves money: replay needs --force and a reason
)
def apply_event(payload: ApplyEvent, ctx: JobContext) -> str:
    """Apply the event, then ask for the receipt when the order became paid."""
    with db.transaction() as session:
        if session.get(shop.PaymentEvent, payload.event_id) is None:
            raise PermanentError(f"unknown payment event {payload.event_id}")
        if not once(session, ctx.idempotency_key):
            return "already applied"
        order = shop.apply_payment(session, payload.event_id)
        paid, order_id = order.status == shop.PAID, order.id
    if paid:
        send_receipt.delay(order_id=order_id)
    return "applied"
