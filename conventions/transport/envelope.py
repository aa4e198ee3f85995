"""The shape of a kombu envelope, checked where the transport claims an entry.

Any client of the broker's Redis can push anything into a queue's list. kombu trusts
what it pops: an entry that is JSON but not the envelope kombu writes (``headers`` a list
or a string, an unknown ``body_encoding``, a body that is not a string or not valid
base64, a delivery tag that is a list...) raises inside the transport's fetch, the
worker stops with "Unrecoverable error", and the entry, given back, stops the next
worker too. :func:`read` checks every field kombu relies on, with the type kombu itself
writes, and turns whatever does not pass (or is not JSON at all) into a message of its
own content type: the layer's consumer dead-letters it as ``unparseable`` with the
reason, and the worker carries on.

The wrapped message keeps the head of the raw entry (``deadletter.MAX_RAW_BODY`` bytes),
its size and its sha256, never more: a 20 MB entry of junk does not travel on as one.

An entry is weighed before it is decoded: one larger than the cap (``max_bytes``:
:func:`entry_cap` of the worker's ``conventions_max_message_bytes``, about 1.4 MB by
default), or with more than :data:`MAX_HEADERS` headers, is wrapped the same way, marked
``too_large``: the consumer dead-letters it as ``invalid``, and neither its JSON (a 113 MB
entry of a million header keys is a dict of several hundred MB) nor Celery's copy of it
is ever made. The wrapper keeps the job's task name and id when the head or the tail of
the entry shows them (:func:`identity`), so that a caller waiting on the job's result
gets its FAILURE.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from conventions.observability.deadletters import MAX_RAW_BODY

#: the content type of a wrapped entry that was not a kombu message
UNPARSEABLE = "application/x-conventions-unparseable"
#: the property of a wrapped entry that says why, how large it was and its digest
WRAPPED = "x-conventions-unparseable"
#: the longest delivery tag taken (kombu writes UUIDs: 36 characters)
MAX_TAG = 256
#: what an envelope adds to a message of its own: kombu's fields, Celery's headers
ENVELOPE_SLACK = 64 * 1024
#: how much of an entry's head and tail is searched for its task name and id
IDENTITY_WINDOW = 64 * 1024
_TASK = re.compile(rb'"task"\s*:\s*"([A-Za-z0-9_.:\-]{1,200})"')
_ID = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9_.:\-]{1,200})"')
#: a batch member's headers (its batches and its key: ``conventions.worker.batch_ends``),
#: a JSON string each, decoded from the entry's text as found
_MEMBER = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*("(?:[^"\\\x00-\x1f]|\\.){1,1024}")')
    for name in ("cc_batch", "cc_idempotency_key")
}


def entry_cap(max_bytes: int) -> int:
    """The largest entry, as read from the broker, of a message of ``max_bytes`` (body,
    headers and properties): kombu's Redis envelope holds the body in base64 (4/3 of
    it) beside its own fields."""
    return max_bytes * 4 // 3 + ENVELOPE_SLACK


#: the largest entry taken unless the consumer says otherwise (bytes as read)
MAX_ENTRY = entry_cap(1024 * 1024)
#: the most headers a message may have (Celery writes about 20, the layer about 12)
MAX_HEADERS = 256
_MISSING = object()


def read(
    entry: bytes,
    queue: str,
    codecs: Mapping[str, Any],
    decode: Callable[..., Any],
    max_bytes: int = MAX_ENTRY,
) -> tuple[dict[str, Any], str, str, str]:
    """The envelope in ``entry``, with its delivery tag, exchange and routing key; an
    entry that is not a well-formed kombu envelope, or is over the caps, comes back
    wrapped for the dead letters (``codecs``/``decode``: the channel's body codecs and
    ``decode_body``; ``max_bytes``: the largest entry taken, weighed before decoding)."""
    if len(entry) > max_bytes:
        weighed = too_large(f"{len(entry)} bytes as read from the broker", max_bytes)
        return _wrapped(entry, queue, weighed, True)
    try:
        payload = loads(bytes_to_str(entry))
    except Exception as exc:
        return _wrapped(entry, queue, f"not a kombu message: not JSON ({type(exc).__name__})")
    if not isinstance(payload, dict):
        return _wrapped(entry, queue, f"not a kombu message: JSON {_kind(payload)}")
    headers = payload.get("headers")
    if isinstance(headers, dict) and len(headers) > MAX_HEADERS:
        return _wrapped(entry, queue, too_many(len(headers)), True)
    reason = problem(payload, codecs, decode)
    if reason is not None:
        return _wrapped(entry, queue, f"malformed envelope: {reason}")
    properties = payload["properties"]
    info = properties["delivery_info"]
    return payload, properties["delivery_tag"], info["exchange"], info["routing_key"]


def own_tag(payload: dict[str, Any]) -> str:
    """Give a well-formed envelope a delivery tag of the layer's own, and return it.

    The tag names the message's in-flight record (kombu's ``unacked`` hash and its
    index) and is what its ack removes; the producer chose the one in the entry, and two
    messages pushed with the same one would share a record: the first ack would take
    the other's with it, and a kill -9 would then lose a running job. A tag per claim
    (kombu's own form, a UUID) is unique among the messages in flight; a message given
    back keeps its last one until its next claim replaces it."""
    tag = str(uuid.uuid4())
    payload["properties"]["delivery_tag"] = tag
    return tag


def problem(
    payload: dict[str, Any], codecs: Mapping[str, Any], decode: Callable[..., Any]
) -> str | None:
    """What is wrong with a kombu envelope, or None: each field kombu reads must have the
    type kombu writes, and the body must decode as its ``body_encoding`` says."""
    properties = payload.get("properties", _MISSING)
    if not isinstance(properties, dict):
        return f"properties is {_kind(properties)}, not an object"
    tag = properties.get("delivery_tag", _MISSING)
    if not isinstance(tag, str) or not tag:
        return f"properties.delivery_tag is {_kind(tag)}, not a string"
    if len(tag) > MAX_TAG:
        return f"properties.delivery_tag is {len(tag)} characters long (at most {MAX_TAG})"
    info = properties.get("delivery_info", _MISSING)
    if not isinstance(info, dict):
        return f"properties.delivery_info is {_kind(info)}, not an object"
    for name in ("exchange", "routing_key"):
        value = info.get(name, _MISSING)
        if not isinstance(value, str):
            return f"properties.delivery_info.{name} is {_kind(value)}, not a string"
    headers = payload.get("headers")
    if headers is not None and not isinstance(headers, dict):
        return f"headers is {_kind(headers)}, not an object"
    for name in ("content-type", "content-encoding"):
        value = payload.get(name)
        if value is not None and not isinstance(value, str):
            return f"{name} is {_kind(value)}, not a string"
    body = payload.get("body", _MISSING)
    if not isinstance(body, str):
        return f"body is {_kind(body)}, not a string"
    encoding = properties.get("body_encoding")
    if encoding is None:
        return None
    if not isinstance(encoding, str):
        return f"properties.body_encoding is {_kind(encoding)}, not a string"
    if encoding.lower() != "utf-8" and encoding not in codecs:
        return f"unknown properties.body_encoding {encoding[:40]!r}"
    try:
        decode(body, encoding)  # kombu decodes it again: a cost paid only by base64 bodies
    except Exception as exc:
        return f"the body is not valid {encoding[:40]} ({type(exc).__name__}: {exc})"[:300]
    return None


def identity(entry: bytes) -> dict[str, str]:
    """The ``task`` and ``id`` headers of an entry too large to decode, when its head or
    its tail shows them (Celery's names and UUIDs, nothing else), else nothing: found
    without decoding, never trusted beyond answering a caller's ``.get()`` and ending
    the batch member it names (``cc_batch``, ``cc_idempotency_key``, read again as any
    header is)."""
    found: dict[str, str] = {}
    for window in (entry[:IDENTITY_WINDOW], entry[-IDENTITY_WINDOW:]):
        for name, pattern in (("task", _TASK), ("id", _ID)):
            match = pattern.search(window)
            if match is not None and name not in found:
                found[name] = match.group(1).decode("ascii")
        for name, pattern in _MEMBER.items():
            match = pattern.search(window)
            if match is not None and name not in found:
                with contextlib.suppress(ValueError):  # JSON's escapes, or not a string
                    found[name] = str(loads(match.group(1)))
    return found


def too_large(size: str, max_bytes: int) -> str:
    """The reason of a message over the size cap."""
    return (
        f"the message is {size}, over the cap of {max_bytes} bytes "
        "(conventions_max_message_bytes): payloads hold ids, not data"
    )


def too_many(count: int) -> str:
    """The reason of a message with more headers than :data:`MAX_HEADERS`."""
    return f"the message has {count} headers, over the cap of {MAX_HEADERS}"


def _kind(value: Any) -> str:
    if value is _MISSING:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def wrap_unparseable(
    entry: bytes, queue: str, reason: str, too_large: bool = False
) -> dict[str, Any]:
    """A kombu message carrying the head of an entry that was not a well-formed one (or
    was over the caps: ``too_large``), with why, its full size and its sha256, for the
    consumer's dead letter."""
    facts: dict[str, Any] = {
        "reason": reason,
        "size": len(entry),
        "sha256": hashlib.sha256(entry).hexdigest(),
    }
    if too_large:
        facts["too_large"] = True
    return {
        "body": base64.b64encode(entry[:MAX_RAW_BODY]).decode("ascii"),
        "content-encoding": "binary",
        "content-type": UNPARSEABLE,
        "headers": identity(entry) if too_large else {},
        "properties": {
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            "delivery_info": {"exchange": "", "routing_key": queue},
            WRAPPED: facts,
        },
    }


def _wrapped(
    entry: bytes, queue: str, reason: str, too_large: bool = False
) -> tuple[dict[str, Any], str, str, str]:
    payload = wrap_unparseable(entry, queue, reason, too_large)
    return payload, payload["properties"]["delivery_tag"], "", queue


def wrapped_facts(message: Any) -> dict[str, Any] | None:
    """What the transport said about a wrapped entry (reason, size, sha256), or None for
    a message that is not one."""
    if message.content_type != UNPARSEABLE:
        return None
    properties = message.properties if isinstance(message.properties, dict) else {}
    facts = properties.get(WRAPPED)
    return facts if isinstance(facts, dict) else {"reason": "not a kombu message"}
