"""Building dead-letter records: scrubbed, truncated, with everything needed to replay.

The record is written *before* the message is rejected or acked: on Redis a rejected
message is simply deleted, so the store is the only home a dead job has.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import traceback as tb
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conventions.store.records import Category, DeadLetter, utcnow
from conventions.tracing import headers as hdr
from conventions.tracing.scrubbing import scrub_text

#: longest message kept in a record
MAX_MESSAGE = 2000
#: longest traceback kept in a record
MAX_TRACEBACK = 8000
#: the most of a rejected body (or payload) a record keeps: its head, in bytes, beside
#: its full size and sha256 (a 20 MB body from a foreign producer is not kept whole)
MAX_RAW_BODY = 16384
#: the longest header value a record keeps as it came (characters; JSON for a list or
#: an object); a longer one is kept as its scrubbed head
MAX_HEADER_VALUE = 2000
#: the most headers a record keeps (the count of the others is kept under ``~dropped``)
MAX_HEADERS = 100
#: longest repr kept of a header the layer refused
MAX_RAW_HEADER = 500
#: how deep a refused payload's structure is kept as such
MAX_DEPTH = 8
#: the key under a record's ``headers`` that keeps the headers the layer refused
REFUSED = "~refused"


def scrub(text: str, limit: int) -> str:
    """Remove what looks like personal data or secrets (``conventions.tracing.scrubbing``, the
    scrubber of every exception text that leaves the process), then cut to ``limit``
    characters."""
    text = scrub_text(text)
    if len(text) > limit:
        text = text[: limit - 20] + "\n... (truncated)"
    return text


def kept_body(data: bytes, *, size: int | None = None, sha256: str | None = None) -> dict[str, Any]:
    """What a record keeps of a body it cannot vouch for: its size and sha256 (of the
    whole body: given when only the head is at hand), and its head of at most
    ``MAX_RAW_BODY`` bytes, as scrubbed text when UTF-8, else base64."""
    head = data[:MAX_RAW_BODY]
    total = len(data) if size is None else size
    kept: dict[str, Any] = {
        "size": total,
        "sha256": sha256 or hashlib.sha256(data).hexdigest(),
        "kept_bytes": MAX_RAW_BODY,
        "truncated": total > len(head),
    }
    for cut in range(4 if total > len(head) else 1):  # the cut may split a character
        try:
            kept["raw_body"] = scrub(head[: len(head) - cut].decode("utf-8"), MAX_RAW_BODY)
            return kept
        except UnicodeDecodeError:
            continue
    kept["raw_body_base64"] = base64.b64encode(head).decode("ascii")
    return kept


def capped_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The payload a record keeps: as it is when its JSON fits in ``MAX_RAW_BODY``
    bytes, else only what ``kept_body`` keeps of that JSON (it cannot be replayed: a
    payload that large is refused by the payload rules anyway)."""
    try:
        text = json.dumps(payload, default=repr).encode("utf-8", "replace")
    except (TypeError, ValueError, RecursionError):
        text = repr(payload).encode("utf-8", "replace")
    return dict(payload) if len(text) <= MAX_RAW_BODY else kept_body(text)


def capped_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The headers a record keeps: at most ``MAX_HEADERS``, each value longer than
    ``MAX_HEADER_VALUE`` characters (its JSON for a list or an object) cut to its
    scrubbed head; a producer's 20 MB header is not kept whole."""
    out: dict[str, Any] = {}
    for index, (name, value) in enumerate(headers.items()):
        if index >= MAX_HEADERS:
            out["~dropped"] = len(headers) - MAX_HEADERS
            break
        if value is None or isinstance(value, bool | int | float) or name == REFUSED:
            out[str(name)[:200]] = value  # the refused ones: already capped one by one
            continue
        size = len(value) if isinstance(value, str) else len(json.dumps(value, default=repr))
        out[str(name)[:200]] = (
            value if size <= MAX_HEADER_VALUE else kept_raw(value, MAX_HEADER_VALUE)
        )
    return out


class CappedRequest:
    """A job's request as a FAILURE result of a rejected message sees it: its ``args``
    and ``kwargs`` (which ``result_extended`` stores) capped as a record's payload is,
    everything else the request's own."""

    def __init__(self, request: Any) -> None:
        self._request = request

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._request, name)
        if name == "kwargs" and isinstance(value, Mapping):
            return capped_payload(value)
        if name == "args" and isinstance(value, list | tuple) and value:
            kept = capped_payload({"args": list(value)})
            return kept.get("args", [kept])
        return value


def our_headers(request: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Our headers as the running job received them, read as untrusted input
    (``hdr.read_headers``): the ones the layer may use, and the raw values of the
    ones it refused (kept in a dead-letter record only, scrubbed and capped)."""
    return hdr.read_headers({name: getattr(request, name, None) for name in hdr.ALL_HEADERS})


def kept_raw(value: Any, limit: int = MAX_RAW_HEADER) -> str:
    """A value from outside as a record keeps it: its repr, scrubbed, capped."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails is foreign code's; say what it was
        text = f"<{type(value).__qualname__}>"
    return scrub(text[: limit * 2], limit)


def scrub_payload(value: Any, depth: int = 0) -> Any:
    """``value`` (decoded JSON) with every string scrubbed, dict keys included; what is
    nested deeper than ``MAX_DEPTH`` is kept as its scrubbed, capped repr.

    For kwargs that failed validation: the payload rules (``conventions.jobs.payloads``) could
    not vouch for them, so they may hold personal data. Ids do not look like it (an
    ``Id`` has no ``@`` and no spaces), so the record stays replayable."""
    if isinstance(value, str):
        return scrub_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= MAX_DEPTH:
        return kept_raw(value)
    if isinstance(value, list | tuple):
        return [scrub_payload(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {scrub_text(str(k)): scrub_payload(v, depth + 1) for k, v in value.items()}
    return kept_raw(value)


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
    refused: Mapping[str, Any] | None = None,
) -> DeadLetter:
    """A dead-letter record for the job behind ``request``; ``refused`` are headers the
    layer did not use (wrong type or format), kept raw beside the others."""
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
        payload=capped_payload(payload),
        headers=capped_headers(_with_refused(headers, refused)),
        idempotency_key=idempotency_key,
        exc_type=type(exc).__qualname__ if exc is not None else "PayloadError",
        message=scrub(reason, MAX_MESSAGE),
        traceback=scrub(trace, MAX_TRACEBACK),
        attempts=int(getattr(request, "retries", 0) or 0) + 1,
        first_failed_at=first_failed_at or now,
        last_failed_at=now,
        worker=str(getattr(request, "hostname", None) or socket.gethostname()),
        queue=delivery.get("routing_key"),
        correlation_id=headers.get(hdr.CORRELATION),
    )


def _with_refused(headers: Mapping[str, Any], refused: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(headers)
    if refused:
        out[REFUSED] = {name: kept_raw(value) for name, value in refused.items()}
    return out


def fallback(
    *,
    task: str,
    task_id: Any,
    category: Category,
    payload: Any,
    raw_headers: Mapping[str, Any],
    reason: str,
    error: BaseException,
) -> DeadLetter:
    """The record of a job whose full record could not be built (``error``): what is
    known for sure, its payload scrubbed and its headers raw (scrubbed, capped), so
    that the job is not lost for want of a well-formed record."""
    now = utcnow()
    return DeadLetter(
        id=uuid.uuid4().hex,
        task=task,
        task_id=scrub(str(task_id or ""), hdr.MAX_ID),
        category=category,
        payload=scrub_payload(payload) if isinstance(payload, dict) else {"raw": kept_raw(payload)},
        headers={REFUSED: {str(k)[:100]: kept_raw(v) for k, v in raw_headers.items()}},
        idempotency_key=None,
        exc_type=type(error).__qualname__,
        message=scrub(f"{reason} (the full record could not be built: {error!r})", MAX_MESSAGE),
        traceback="",
        attempts=1,
        first_failed_at=now,
        last_failed_at=now,
        worker=socket.gethostname(),
        queue=None,
        correlation_id=None,
    )
