"""The web process: a publisher per contract, and no job body imported."""

from __future__ import annotations

from conventions import App
from examples.howto import contracts

app = App("myproject-web")
app.config_from_object("celeryconfig")

send_invoice = app.publisher(contracts.SEND_INVOICE)


def on_invoice_created(invoice_id: str) -> str:
    """A web handler's side: validated, keyed and deduplicated here, run by a worker."""
    return str(send_invoice.delay(invoice_id=invoice_id).id)
