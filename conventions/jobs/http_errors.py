"""What an HTTP error says, read without importing its library: the status, Retry-After.

urllib's ``HTTPError`` carries ``.code``; requests and httpx hang a ``.response`` with
``.status_code`` and ``.headers``; aiohttp has ``.status``. ``conventions.jobs.decisions``
classifies by these, and ``conventions.capacity.limits`` reads a 429's ``Retry-After`` to know
when to come back.
"""

from __future__ import annotations

import math
import re
import urllib.error
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any


def safe_attr(obj: object, name: str) -> Any:
    """``getattr`` that treats a raising property as missing (httpx raises on some)."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries: urllib's ``.code``, ``.response.status_code``
    (requests, httpx), ``.status_code`` or ``.status`` (aiohttp); None when it has none."""
    candidates = [exc.code] if isinstance(exc, urllib.error.HTTPError) else []
    response = safe_attr(exc, "response")
    candidates += [
        safe_attr(response, "status_code"),
        safe_attr(exc, "status_code"),
        safe_attr(exc, "status"),
    ]
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return int(value)
    return None


def retry_after_header(exc: BaseException) -> str | None:
    """The ``Retry-After`` header from ``exc.headers`` or ``exc.response.headers``."""
    for headers in (safe_attr(exc, "headers"), safe_attr(safe_attr(exc, "response"), "headers")):
        get = safe_attr(headers, "get")
        for key in ("Retry-After", "retry-after") if callable(get) else ():
            try:
                value = get(key)
            except Exception:
                break
            if value is not None:
                return str(value)
    return None


_SECONDS = re.compile(r"\d+(\.\d+)?")


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delay-seconds (``"120"``) or an
    HTTP-date (``"Wed, 21 Oct 2015 07:28:00 GMT"``, counted from ``now``, by default the
    current UTC time; a date in the past gives 0). None when absent or unparseable."""
    if value is None:
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        return float(text)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    now = now or datetime.now(UTC)
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    seconds = (moment - (now if now.tzinfo else now.replace(tzinfo=UTC))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


#: statuses that mean "try again later"; every 5xx is transient too
RETRY_STATUSES = frozenset({408, 425, 429})
#: statuses whose ``Retry-After`` header is honoured
RETRY_AFTER_STATUSES = frozenset({429, 503})
