"""The names of our message headers, and the typed reader of each.

Every header of ours starts with ``cc_`` and is listed here (and in
``docs/reference/headers.md``), beside the two W3C trace-context headers the layer carries
under their standard names (``traceparent``, ``tracestate``: what OpenTelemetry's
propagator and ``opentelemetry-instrumentation-celery`` read and write). None is named
after a Celery ``Context`` attribute: Celery overwrites ``correlation_id`` with the task
id. In the worker, headers are read as ``task.request`` attributes, since Sentry
reshapes ``request.headers``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from conventions.config import formats

_logger = logging.getLogger("conventions.tracing.headers")

PREFIX = "cc_"
#: the version of the headers and envelope of the message (``conventions.config.formats``):
#: set on every publish by the publish hook, checked by the worker's consumer before
#: anything else; absent on an older release's or a foreign producer's message
FORMAT = formats.HEADER
#: the story this job belongs to: one per web request, beat occurrence or foreign message
CORRELATION = "cc_correlation"
#: the web request id, when the story started in a web request
REQUEST = "cc_request"
#: what caused this job: ``job:<task id>`` or ``request:<id>`` or ``beat:<entry>``
CAUSATION = "cc_causation"
#: who acted (a user id, ``beat``, ``replay:<actor>``)
ACTOR = "cc_actor"
#: the job's idempotency key
IDEMPOTENCY_KEY = "cc_idempotency_key"
#: when the job was first published (ISO 8601, UTC); kept across retries
ENQUEUED_AT = "cc_enqueued_at"
#: the dead-letter id this job was replayed from
REPLAY_OF = "cc_replay_of"
#: set on a retry after an uncertain outcome: the next attempt reconciles first
RECONCILE = "cc_reconcile"
#: when the first attempt failed (ISO 8601, UTC); kept across retries for the dead letter
FIRST_FAILED_AT = "cc_first_failed_at"
#: how often the job stopped on purpose to continue later (``ResumeLater``)
RESUMED = "cc_resumed"
#: the due time of a message that waited in the Redis transport's delayed set (ISO 8601,
#: UTC): set by the transport, which takes the ``eta`` out (``conventions.transport.delayed``)
DUE = "cc_due"
#: the dependency limiter's state across deferrals: places booked in line, slot waits
LIMITS = "cc_limits"
#: the schedule entry that sent this job (``conventions.schedules.entries``)
SCHEDULE = "cc_schedule"
#: the scheduled time of the entry's occurrence (ISO 8601, UTC), not the send time
OCCURRENCE = "cc_occurrence"
#: the entry's overlap policy: ``skip``, ``replace`` or ``allow``
OVERLAP = "cc_overlap"
#: the batches this job is a member of, innermost first, comma-separated
#: (:mod:`conventions.batches.declare`): kept across retries, deferrals and replays
BATCH = "cc_batch"
#: the W3C trace context of the span that published this job (``00-<trace>-<span>-<flags>``):
#: written by OpenTelemetry's propagator when traces are on (``conventions.tracing.otel``),
#: kept across retries and deferrals; in a worker, the run's own span (a dead letter keeps
#: it, so that a replay links to the run that failed)
TRACEPARENT = "traceparent"
#: the W3C trace state that goes with ``traceparent`` (vendor entries)
TRACESTATE = "tracestate"
#: the ``traceparent`` of the job's first attempt's run span: every later attempt's run
#: span links to it
FIRST_SPAN = "cc_first_span"

ALL_HEADERS = (
    FORMAT,
    CORRELATION,
    REQUEST,
    CAUSATION,
    ACTOR,
    IDEMPOTENCY_KEY,
    ENQUEUED_AT,
    REPLAY_OF,
    RECONCILE,
    FIRST_FAILED_AT,
    RESUMED,
    LIMITS,
    SCHEDULE,
    OCCURRENCE,
    OVERLAP,
    BATCH,
    DUE,
    FIRST_SPAN,
    TRACEPARENT,
    TRACESTATE,
)
#: the headers a child job inherits from its parent's context
INHERITED = (CORRELATION, REQUEST, ACTOR)
#: a publish option (not a header) the layer sets on a publish it has already checked: a
#: retry, a deferral, a replay's own publish, a job published by ``send_task`` after its
#: checks; ``apply_async`` does not check such a call again
READY: Final = "_cc_ready"

# Any producer can set any header to anything (a list, a 1 MB string, a date that is not
# one). Each header of ours is read by one typed reader: a value of the wrong type or
# format is left out, with a warning, and never reaches the run path, the audit trail or
# a dead-letter record's fields (the record keeps it raw, scrubbed and capped: ``deadletter``).

#: the longest id-like header kept (correlation, causation, actor, replay, schedule)
MAX_ID = 256
#: the longest idempotency key header kept
MAX_KEY = 1024
#: the longest time header kept (ISO 8601 needs about 32)
MAX_TIME = 64
#: the most ``cc_resumed`` can count
MAX_RESUMED = 1_000_000
#: the longest ``tracestate`` kept (W3C: 32 entries of at most 256 characters, in practice
#: far less)
MAX_TRACESTATE = 1024
#: the overlap policies a schedule entry can name
OVERLAP_POLICIES = ("skip", "replace", "allow")


class BadHeader(ValueError):
    """A header of ours whose value is of the wrong type or format."""


def _text(value: Any, limit: int) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadHeader(f"a {type(value).__qualname__}, not a string")
    text = str(value)
    if not text or len(text) > limit:
        raise BadHeader(f"{len(text)} characters, not 1 to {limit}")
    return text


def parse_time(value: Any) -> datetime:
    """An ISO 8601 time header as an aware datetime (a naive one is read as UTC)."""
    text = _text(value, MAX_TIME)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadHeader("not an ISO 8601 time") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _time(value: Any) -> str:
    parse_time(value)
    return str(value)


def _count(value: Any) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 8:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RESUMED:
        raise BadHeader(f"not a count from 0 to {MAX_RESUMED}")
    return value


def _version(value: Any) -> int:
    found = formats.version_of(value)
    if found is None:
        raise BadHeader(f"not a version from 1 to {formats.MAX_VERSION}")
    return found


def _flag(value: Any) -> str:
    if value in (True, 1, "1", "true", "True"):
        return "1"
    if value in (False, 0, "", "0", "false", "False", None):
        return ""
    raise BadHeader("not a flag")


def _overlap(value: Any) -> str:
    if value not in OVERLAP_POLICIES:
        raise BadHeader(f"not one of {', '.join(OVERLAP_POLICIES)}")
    return str(value)


def _limits(value: Any) -> dict[str, Any]:
    """The limiter's state: ``{"booked": [names], "waits": count}``, both optional."""
    if not isinstance(value, dict) or not set(value) <= {"booked", "waits"}:
        raise BadHeader("not the limiter's state")
    booked = value.get("booked") or []
    if not isinstance(booked, list) or not all(isinstance(n, str) for n in booked):
        raise BadHeader("booked is not a list of names")
    return {"booked": [_text(n, MAX_ID) for n in booked], "waits": _count(value.get("waits", 0))}


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-f-]{1,64})?")


def _traceparent(value: Any) -> str:
    """A W3C ``traceparent`` (version, trace id, span id, flags; a later version may add
    fields after them, kept)."""
    text = _text(value, 128)
    if not _TRACEPARENT.fullmatch(text) or text.startswith("ff-"):
        raise BadHeader("not a W3C traceparent")
    return text


def trace_id(headers: Mapping[str, Any] | None) -> str | None:
    """The W3C trace id of a job's ``traceparent`` header (what a tracing UI searches by),
    or None when there is none or it is malformed (a foreign producer's)."""
    value = (headers or {}).get(TRACEPARENT)
    text = value.strip().lower() if isinstance(value, str) else ""
    if not _TRACEPARENT.fullmatch(text) or text.startswith("ff-"):
        return None
    trace = text.split("-")[1]
    return None if trace == "0" * 32 else trace


_READERS: dict[str, Callable[[Any], Any]] = {
    **{name: lambda v: _text(v, MAX_ID) for name in (CORRELATION, REQUEST, CAUSATION, ACTOR)},
    **{name: lambda v: _text(v, MAX_ID) for name in (REPLAY_OF, SCHEDULE)},
    IDEMPOTENCY_KEY: lambda v: _text(v, MAX_KEY),
    BATCH: lambda v: _text(v, MAX_KEY),
    ENQUEUED_AT: _time,
    FIRST_FAILED_AT: _time,
    OCCURRENCE: _time,
    DUE: _time,
    RESUMED: _count,
    FORMAT: _version,
    RECONCILE: _flag,
    OVERLAP: _overlap,
    LIMITS: _limits,
    TRACEPARENT: _traceparent,
    FIRST_SPAN: _traceparent,
    TRACESTATE: lambda v: _text(v, MAX_TRACESTATE),
}


def read_header(name: str, value: Any, *, warn: bool = True) -> Any:
    """Header ``name``'s value as the layer uses it, or None when it is absent or junk
    (logged as a warning, unless ``warn`` is off: the message goes on without it)."""
    if value is None:
        return None
    try:
        return _READERS[name](value)
    except BadHeader as exc:
        if warn:
            _logger.warning("header %s ignored: %s", name, exc)
        return None


def read_headers(raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Our headers among ``raw``, each read by its reader: the ones the layer may use,
    and the ones it refused (their raw values, for the dead-letter record)."""
    good: dict[str, Any] = {}
    refused: dict[str, Any] = {}
    for name in ALL_HEADERS:
        value = raw.get(name)
        if value is None:
            continue
        read = read_header(name, value)
        if read is None:
            refused[name] = value
        elif read != "":  # a flag that says no is the same as no header
            good[name] = read
    return good, refused
