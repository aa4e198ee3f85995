"""What a web process imports to publish the shop's jobs: the contracts, not the bodies.

    from tasks.publishing import send_receipt
    send_receipt.delay(order_id="ord_0001")    # validated, keyed, deduplicated here

The publishers validate, key, deduplicate and set headers exactly as the jobs' own
``.delay()`` do; the bodies run in the worker (``celery -A tasks worker``).
"""

from __future__ import annotations

from conventions import App
from tasks import contracts

app = App("tasks-web")
app.config_from_object("celeryconfig")

send_receipt = app.publisher(contracts.SEND_RECEIPT)
apply_event = app.publisher(contracts.APPLY_EVENT)
daily_sales = app.publisher(contracts.DAILY_SALES)

__all__ = ["app", "apply_event", "daily_sales", "send_receipt"]
