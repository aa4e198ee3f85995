"""Building dead-letter records: scrubbed, truncated, with everything needed to replay.

The record is written *before* the message is rejected or acked: on Redis a rejected
message is simply deleted, so the store is the only home a dead job has.
"""

from __future__ import annotations

import socket
import traceback as tb
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conventions import context
from conventions.records import Category, DeadLetter, utcnow
from conventions.scrubbing import scrub_text

#: longest message kept in a record
MAX_MESSAGE = 2000
#: longest traceback kept in a record
MAX_TRACEBACK = 8000


def scrub(text: str, limit: int) -> str:
    """Remove what looks like personal data or secrets (``conventions.scrubbing``, the
    scrubber of every exception text that leaves the process), then cut to ``limit``
    characters."""
    text = scrub_text(text)
    if len(text) > limit:
        text = text[: limit - 20] + "\n... (truncated)"
    return text


def our_headers(request: Any) -> dict[str, Any]:
    """Our headers as the running job received them."""
    out: dict[str, Any] = {}
    for name in context.ALL_HEADERS:
        value = getattr(request, name, None)
        if value is not None:
            out[name] = value
    return out


def build(
    *,
    task: str,
    request: Any,
    headers: Mapping[str, Any],
    category: Category,
    payload: Mapping[str, Any],
    idempotency_key: str | None,
    exc: BaseException | None,
    reason: str,
    first_failed_at: datetime | None = None,
) -> DeadLetter:
    """A dead-letter record for the job behind ``request``."""
    now = utcnow()
    trace = ""
    if exc is not None and exc.__traceback__ is not None:
        trace = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    delivery = getattr(request, "delivery_info", None) or {}
    return DeadLetter(
        id=uuid.uuid4().hex,
        task=task,
        task_id=str(getattr(request, "id", "") or ""),
        category=category,
        payload=dict(payload),
        headers=dict(headers),
        idempotency_key=idempotency_key,
        exc_type=type(exc).__qualname__ if exc is not None else "PayloadError",
        message=scrub(reason, MAX_MESSAGE),
        traceback=scrub(trace, MAX_TRACEBACK),
        attempts=int(getattr(request, "retries", 0) or 0) + 1,
        first_failed_at=first_failed_at or now,
        last_failed_at=now,
        worker=str(getattr(request, "hostname", None) or socket.gethostname()),
        queue=delivery.get("routing_key"),
        correlation_id=headers.get(context.CORRELATION),
    )
