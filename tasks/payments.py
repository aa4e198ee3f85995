"""``payments.apply_event.v1``: apply a payment webhook event to its order, once.

Webhooks arrive twice, get retried, get replayed: the event id is the idempotency key,
the ``once`` marker commits with the payment, and the receipt goes out as a child job
(which inherits the correlation id and names this job as its cause).
"""

from __future__ import annotations

from conventions import JobContext, PermanentError
from conventions.transactional.once import once
from tasks import contracts, db, shop
from tasks.celery import app
from tasks.contracts import ApplyEvent

#: the receipt job, published by its contract (its body is in tasks.receipts)
send_receipt = app.publisher(contracts.SEND_RECEIPT)


@app.job(
    contracts.APPLY_EVENT,
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
