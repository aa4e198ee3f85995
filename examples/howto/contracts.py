"""A project's ``contracts.py``: the jobs a web process publishes, without their bodies."""

from __future__ import annotations

from conventions import Contract, Id, Payload


class SendInvoice(Payload):
    invoice_id: Id


SEND_INVOICE = Contract(
    "billing.send_invoice.v1",
    payload=SendInvoice,
    key="invoice:{invoice_id}",
    workload="email",
)
