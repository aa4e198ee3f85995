"""The correlation context: which story the code that runs now belongs to.

Web code binds a context per request (``bind(...)`` or the middleware in
``conventions.contrib.web``); ``.delay()`` picks it up. Inside a job the context is the job's,
so child jobs inherit its correlation id and name the job as their cause (the signal
handlers in ``conventions.worker.signals`` do this for every publish, plain tasks included).
The header names it reads and writes are in :mod:`conventions.tracing.headers`.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from conventions.tracing.headers import (
    ACTOR,
    CAUSATION,
    CORRELATION,
    REQUEST,
    read_header,
)


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

    A message from a foreign producer has none of our headers (or junk in them: each is
    read by ``read_header``): it gets a fresh correlation id at receipt (``assign`` keeps
    it on the request, so every later read of this delivery finds the same one).
    """
    correlation = read_header(CORRELATION, getattr(request, CORRELATION, None), warn=False)
    if not correlation:
        correlation = new_id()
        if assign:
            setattr(request, CORRELATION, correlation)
    return Trace(
        correlation_id=correlation,
        request_id=read_header(REQUEST, getattr(request, REQUEST, None), warn=False),
        causation_id=read_header(CAUSATION, getattr(request, CAUSATION, None), warn=False),
        actor_id=read_header(ACTOR, getattr(request, ACTOR, None), warn=False),
    )


# -- reading our headers from a message: untrusted input ----------------------------------
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
