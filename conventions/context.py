"""Correlation context and the names of our message headers.

Every header of ours starts with ``cc_`` and is listed here (and in
``docs/reference/headers.md``). None is named after a Celery ``Context`` attribute:
Celery overwrites ``correlation_id`` with the task id. In the worker, headers are read
as ``task.request`` attributes, since Sentry reshapes ``request.headers``.

Web code binds a context per request (``bind(...)`` or the middleware in
``conventions.web``); ``.delay()`` picks it up. Inside a job the context is the job's,
so child jobs inherit its correlation id and name the job as their cause (the signal
handlers in ``conventions.tracing`` do this for every publish, plain tasks included).
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

PREFIX = "cc_"
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
#: the dependency limiter's state across deferrals: places booked in line, slot waits
LIMITS = "cc_limits"
#: the schedule entry that sent this job (``conventions.schedules``)
SCHEDULE = "cc_schedule"
#: the scheduled time of the entry's occurrence (ISO 8601, UTC), not the send time
OCCURRENCE = "cc_occurrence"
#: the entry's overlap policy: ``skip``, ``replace`` or ``allow``
OVERLAP = "cc_overlap"

ALL_HEADERS = (
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
)
#: the headers a child job inherits from its parent's context
INHERITED = (CORRELATION, REQUEST, ACTOR)


def new_id() -> str:
    """A fresh correlation or request id."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Trace:
    """The correlation context bound to the current request or job."""

    correlation_id: str
    request_id: str | None = None
    causation_id: str | None = None
    actor_id: str | None = None

    def headers(self) -> dict[str, str]:
        """The headers a job published under this context carries."""
        out = {CORRELATION: self.correlation_id}
        if self.request_id:
            out[REQUEST] = self.request_id
        if self.causation_id:
            out[CAUSATION] = self.causation_id
        if self.actor_id:
            out[ACTOR] = self.actor_id
        return out


_current: contextvars.ContextVar[Trace | None] = contextvars.ContextVar(
    "conventions_trace", default=None
)


def current() -> Trace | None:
    """The bound context, or None outside any request or job."""
    return _current.get()


@contextlib.contextmanager
def bind(
    correlation_id: str | None = None,
    request_id: str | None = None,
    actor_id: str | None = None,
    causation_id: str | None = None,
) -> Iterator[Trace]:
    """Bind a correlation context for the block (a web request, a script, a test)."""
    request_id = request_id or new_id()
    trace = Trace(
        correlation_id=correlation_id or new_id(),
        request_id=request_id,
        causation_id=causation_id or f"request:{request_id}",
        actor_id=actor_id,
    )
    token = _current.set(trace)
    try:
        yield trace
    finally:
        _current.reset(token)


def activate(trace: Trace) -> contextvars.Token[Trace | None]:
    """Make ``trace`` current (the worker does this around a job); undo with ``reset``."""
    return _current.set(trace)


def reset(token: contextvars.Token[Trace | None]) -> None:
    _current.reset(token)


def now_iso() -> str:
    """Now, as our time headers spell it (ISO 8601, UTC)."""
    return datetime.now(UTC).isoformat()


def from_request(request: Any, *, assign: bool = False) -> Trace:
    """The context of a running job, read from its ``task.request`` attributes.

    A message from a foreign producer has none of our headers: it gets a fresh
    correlation id at receipt (``assign`` keeps it on the request, so every later read
    of this delivery finds the same one).
    """
    correlation = getattr(request, CORRELATION, None)
    if not correlation:
        correlation = new_id()
        if assign:
            setattr(request, CORRELATION, correlation)
    return Trace(
        correlation_id=correlation,
        request_id=getattr(request, REQUEST, None),
        causation_id=getattr(request, CAUSATION, None),
        actor_id=getattr(request, ACTOR, None),
    )


def for_child(parent: Trace, parent_task_id: str) -> Trace:
    """The context a job publishes its children under: same story, caused by the job."""
    return replace(parent, causation_id=f"job:{parent_task_id}")


def outgoing(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Our headers for a publish: the caller's own, completed from the bound context."""
    out: dict[str, Any] = {}
    trace = current()
    if trace is not None:
        out.update(trace.headers())
    if headers:
        out.update(headers)
    if CORRELATION not in out:
        out[CORRELATION] = new_id()
    return out
