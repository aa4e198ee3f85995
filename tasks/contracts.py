"""The shop's job contracts: what a web process and the worker both import.

Each contract names a job, its payload, its idempotency key and its workload. This
module imports the layer's declarations and pydantic only: never a job body, the shop's
models or the mail client. The worker declares each body against its contract
(``tasks.receipts``, ``tasks.payments``, ``tasks.reports``); a web process publishes
through ``tasks.publishing``.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from conventions import Contract, Id, Payload


class SendReceiptV1(Payload):
    """Which order's receipt to send (v1: still accepted while old messages drain)."""

    order_id: Id


class SendReceipt(Payload):
    """Which order's receipt to send, and in which layout (v2)."""

    order_id: Id
    layout: Literal["basic", "detailed"] = "basic"


class ApplyEvent(Payload):
    """Which payment event to apply."""

    event_id: Id


class DailySales(Payload):
    """Which business day to report."""

    business_date: dt.date


SEND_RECEIPT = Contract(
    "email.send_receipt.v2", payload=SendReceipt, key="receipt:{order_id}", workload="email"
)
APPLY_EVENT = Contract(
    "payments.apply_event.v1",
    payload=ApplyEvent,
    key="payment-event:{event_id}",
    workload="email",
)
DAILY_SALES = Contract(
    "reports.daily_sales.v1",
    payload=DailySales,
    key="daily-sales:{business_date}",
    workload="heavy",
)
