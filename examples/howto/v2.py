"""A v2 of a task beside its v1 upcaster (docs/howto/ship-a-v2.md)."""

from __future__ import annotations

from typing import Literal

from conventions import Id, JobContext, Payload
from examples.howto.app import app


class SendInvoiceV1(Payload):
    """Which order's invoice to send (v1: still accepted while old messages drain)."""

    order_id: Id


class SendInvoice(Payload):
    """Which order's invoice to send, and in which layout (v2)."""

    order_id: Id
    layout: Literal["basic", "detailed"] = "basic"


@app.job("email.send_invoice.v2", payload=SendInvoice, key="invoice:{order_id}", workload="email")
def send_invoice(payload: SendInvoice, ctx: JobContext) -> str:
    return f"sent the {payload.layout} invoice of {payload.order_id}"


@app.upcaster("email.send_invoice.v1", payload=SendInvoiceV1, into=send_invoice)
def send_invoice_v1(old: SendInvoiceV1) -> SendInvoice:
    """v1 messages run as v2 with the basic layout (same key: one invoice per order)."""
    return SendInvoice(order_id=old.order_id)
