"""The worker's side: the body, declared against the contract the web process shares."""

from __future__ import annotations

from conventions import Backoff, JobContext
from examples.howto import contracts
from examples.howto.app import app


@app.job(contracts.SEND_INVOICE, backoff=Backoff(base=1.0))
def send_invoice(payload: contracts.SendInvoice, ctx: JobContext) -> str:
    return f"sent {payload.invoice_id} once, under {ctx.idempotency_key}"
