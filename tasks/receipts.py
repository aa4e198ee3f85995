"""``email.send_receipt.v2`` (and v1, upcast): send an order's receipt once.

The receipt has a deterministic Message-ID (``<receipt.ord_1@shop.example>``), so a
mail server or a person can tell a resend from a second receipt. The send is recorded in
the same transaction as the ``once`` marker: a crash after the SMTP server accepted the
mail and before the commit can send it again (at-least-once at the SMTP boundary, see
docs/discussions/delivery-guarantees.md); nothing else can.
"""

from __future__ import annotations

import logging
import smtplib
from email.message import EmailMessage
from urllib.parse import urlparse

from conventions import Backoff, JobContext, PermanentError
from conventions.transactional.once import once
from tasks import contracts, db, shop
from tasks.celery import app
from tasks.contracts import SendReceipt, SendReceiptV1

logger = logging.getLogger(__name__)


def message_id(order_id: str) -> str:
    """The receipt's deterministic Message-ID."""
    return f"<receipt.{order_id}@shop.example>"


def _deliver(mail: EmailMessage) -> None:
    url = app.conf.shop_smtp_url
    if not url:
        logger.info("receipt %s recorded (no SMTP_URL set)", mail["Message-ID"])
        return
    parsed = urlparse(str(url))
    with smtplib.SMTP(parsed.hostname or "localhost", parsed.port or 25, timeout=10) as smtp:
        smtp.send_message(mail)


#: a mail provider's 451 is usually a hiccup of seconds: start from 1 s (the default budget
#: otherwise, about half an hour in all, still outlasts a provider's outage)
RECEIPT_BACKOFF = Backoff(base=1.0)


@app.job(contracts.SEND_RECEIPT, backoff=RECEIPT_BACKOFF)
def send_receipt(payload: SendReceipt, ctx: JobContext) -> str:
    """Send the receipt of ``payload.order_id`` unless it was already sent."""
    with db.transaction() as session:
        order = session.get(shop.Order, payload.order_id)
        if order is None:
            raise PermanentError(f"unknown order {payload.order_id}")
        customer = session.get(shop.Customer, order.customer_id)
        assert customer is not None
        if not once(session, ctx.idempotency_key):
            return "already sent"
        mail = EmailMessage()
        mail["Message-ID"] = message_id(order.id)
        mail["From"] = "shop@shop.example"
        mail["To"] = customer.email
        mail["Subject"] = f"Your receipt for order {order.id}"
        lines = [f"Paid: {order.paid_minor / 100:.2f} {order.currency}"]
        if payload.layout == "detailed":
            lines.append(f"Order total: {order.amount_minor / 100:.2f} {order.currency}")
        mail.set_content("\n".join(lines))
        session.add(
            shop.SentEmail(
                order_id=order.id,
                message_id=mail["Message-ID"],
                recipient=customer.email,
                subject=mail["Subject"],
            )
        )
        session.flush()
        _deliver(mail)
    return "sent"


@app.upcaster("email.send_receipt.v1", payload=SendReceiptV1, into=send_receipt)
def send_receipt_v1(old: SendReceiptV1) -> SendReceipt:
    """v1 messages run as v2 with the basic layout (same key: one receipt per order)."""
    return SendReceipt(order_id=old.order_id)
