"""The Celery signal handlers that carry the correlation context everywhere.

- ``before_task_publish``: every publish gets our headers, not only ``.delay()`` of a
  convention task: ``send_task``, canvas steps, plain Celery tasks, beat. Inside a job the
  bound context is the job's, so children inherit its correlation id and name it as their
  cause; outside any context (beat, a script) each publish starts a new story. Each
  message says which version of the headers wrote it (``cc_format``: the version of
  this process's release, even on a retry of an older message, since this process
  wrote the headers anew; ``conventions.config.formats``). Flower
  renders no custom headers, so the correlation id is also appended to the display-only
  kwargs repr of every publish: a first publish, a retry, a deferral, a replay, a child.
- ``after_task_publish``: only where ``opentelemetry-instrumentation-celery`` is installed,
  to name the message on its publish span (an always-connected receiver would cost every
  publish a few microseconds for nothing).
- ``task_prerun`` / ``task_postrun``: bind the job for logs (:mod:`conventions.tracing.logs`),
  Sentry tags and child publishes, for every task. A message from a foreign producer
  without our headers gets its correlation id here, at receipt.

Each app connects them for its own tasks (:mod:`conventions.worker.wiring`, which also
sets the worker's log format on ``after_setup_logger``). Each handler is a few dictionary
operations: they run on every publish and every job.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

from conventions.config import formats
from conventions.observability import alerts
from conventions.results import redis as results
from conventions.tracing import context, logs, spans
from conventions.tracing import headers as hdr

#: the request attribute that keeps the context token of the running delivery (a retry
#: reuses the task id and may start in another thread before this one's postrun)
_TOKEN = "_cc_context_token"


def on_before_publish(
    headers: dict[str, Any] | None = None, task: Any = None, routing_key: Any = None, **_: Any
) -> None:
    """Complete the headers of a publish that did not go through a convention task, and
    show the correlation id in the kwargs repr of every publish (a retry, a deferral:
    Celery makes their repr afresh from the kwargs, without it). Where this process
    traces, the trace context goes into the headers too (:mod:`conventions.tracing.otel`)."""
    if headers is None:
        return
    headers[hdr.FORMAT] = formats.HEADERS  # the version of the code that wrote them
    if hdr.CORRELATION not in headers:  # not ours yet: a plain task, beat, a script
        for name, value in context.outgoing(None).items():
            headers.setdefault(name, value)
        headers.setdefault(hdr.ENQUEUED_AT, context.now_iso())
    show_correlation(headers)
    traces = spans.active()  # None unless this process traces: never imports OpenTelemetry
    if traces is not None:
        traces.before_publish(task, headers, routing_key)


def on_after_publish(
    headers: dict[str, Any] | None = None, task: Any = None, routing_key: Any = None, **_: Any
) -> None:
    """Name the message on the publish span of ``opentelemetry-instrumentation-celery``
    when its hook runs after ours (connected only where it is installed)."""
    if headers is not None and (traces := spans.active()) is not None:
        traces.after_publish(task, headers, routing_key)


def kwargs_shown(kwargs: dict[str, Any], headers: dict[str, Any]) -> str:
    """What Flower shows as a job's kwargs: the payload plus the correlation id (display
    only). A publish passes it as ``kwargsrepr``: Celery's ``task-sent`` event is made
    before the publish hook runs, and carries only what the publish was given."""
    shown = dict(kwargs)
    shown["~correlation"] = headers.get(hdr.CORRELATION)
    return repr(shown)


def show_correlation(headers: dict[str, Any]) -> None:
    """Append ``'~correlation': <id>`` to the display-only ``kwargsrepr`` unless it ends
    with it already (a convention task's first publish made it so)."""
    shown = headers.get("kwargsrepr")
    if not isinstance(shown, str) or not shown.endswith("}"):
        return
    tail = f"'~correlation': {headers.get(hdr.CORRELATION)!r}}}"
    if not shown.endswith(tail):
        glue = ", " if shown != "{}" else ""
        headers["kwargsrepr"] = f"{shown[:-1]}{glue}{tail}"


def on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """Bind the job's context before its body runs."""
    if task is None or task_id is None:
        return
    request = task.request
    trace = context.from_request(request, assign=True)
    setattr(request, _TOKEN, context.activate(context.for_child(trace, task_id)))
    key = hdr.read_header(
        hdr.IDEMPOTENCY_KEY, getattr(request, hdr.IDEMPOTENCY_KEY, None), warn=False
    )
    name = task.name
    version = logs.version_of(name)
    logs.bind_job(
        correlation_id=trace.correlation_id,
        request_id=trace.request_id,
        task=name,
        version=version,
        task_id=task_id,
        idempotency_key=key,
        attempt=int(request.retries or 0) + 1,
    )
    sentry_sdk = alerts.active_sentry()  # never imports it: None unless Sentry is in use
    if sentry_sdk is not None:
        sentry_sdk.set_tag("correlation_id", trace.correlation_id)
        sentry_sdk.set_tag("task", name)
        if version:
            sentry_sdk.set_tag("version", version)
        if queue := (request.delivery_info or {}).get("routing_key"):
            sentry_sdk.set_tag("queue", queue)
        if key:
            sentry_sdk.set_tag("idempotency_key", key)


def on_postrun(task: Any = None, **_: Any) -> None:
    """Settle what no result write took (:func:`conventions.results.redis.settle`), then unbind
    the context once Celery has logged the outcome."""
    try:
        results.settle()
    finally:
        _unbind(task)


def _unbind(task: Any) -> None:
    logs.clear_job()
    request = getattr(task, "request", None)
    token: contextvars.Token[context.Trace | None] | None = getattr(request, _TOKEN, None)
    if token is not None:
        setattr(request, _TOKEN, None)
        with contextlib.suppress(ValueError):  # made in another context: nothing to undo here
            context.reset(token)
