"""A payload that uses every allowed kind of field (docs/howto/payload-rules.md)."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Literal

from conventions import Id, Payload, sensitive


class Layout(StrEnum):
    BASIC = "basic"
    DETAILED = "detailed"


class SendStatement(Payload):
    customer_id: Id
    period_end: dt.date
    layout: Layout = Layout.BASIC
    channel: Literal["email", "post"] = "email"
    resend: bool = False
    customer_email_id: Id | None = sensitive(
        "the id of an address row, not the address", default=None
    )
