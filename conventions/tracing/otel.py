"""OpenTelemetry spans for publishes and runs (the ``otel`` extra; loaded by
:mod:`conventions.tracing.spans` only where traces are on).

- **publish**: a PRODUCER span ``publish <task>`` around a convention task's
  ``apply_async`` (a first publish, a retry, a deferral, a replay's, beat's). The
  ``before_task_publish`` hook names the message on it and writes its context into the
  message headers with the global propagator (W3C ``traceparent`` by default). A plain
  Celery task or ``send_task`` by name gets no span of ours, only the current context.
- **run**: a CONSUMER span ``run <task>`` around a delivery, a child of the publish span
  the message names, with the attributes ``conventions.task``, ``.version``,
  ``.idempotency_key``, ``.attempt``, ``.decision`` (``succeeded``, ``retry``,
  ``dead_letter``, ``skip``, ``defer``) and ``conventions.dead_letter.category``/``.id``.
  A later attempt's run span links to the first attempt's (``cc_first_span``).
- **new traces**: a replay and a beat occurrence open a root span (``replay <task>``,
  ``beat <entry>``) linked to what caused them (the dead-lettered run; the caller's span,
  when a trigger runs inside one); their publish and run spans are its children.

With ``opentelemetry-instrumentation-celery`` instrumented, the layer opens no publish
or run span of its own: it writes its attributes (and the retry link) on the
instrumentation's spans, which propagate the context themselves. Exceptions are not
recorded on spans (their text may hold personal data): the status says the type and
the scrubbed message.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from conventions.tracing import headers as hdr
from conventions.tracing import spans
from conventions.tracing.logs import version_of
from conventions.tracing.scrubbing import scrub_text

#: the name of the layer's tracer (its instrumentation scope)
SCOPE = "celery-conventions"

_W3C = TraceContextTextMapPropagator()
_tracers: dict[int, tuple[Any, trace.Tracer]] = {}
#: the layer's publish span while a convention task publishes (the hook annotates it)
_publishing: ContextVar[Span | None] = ContextVar("conventions_publish_span", default=None)


class _RequestGetter(Getter[Any]):
    """Reads a propagator's headers from ``task.request`` (Celery keeps message headers
    as its attributes)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


_REQUEST = _RequestGetter()


def tracer() -> trace.Tracer:
    """The layer's tracer, of the provider given to ``spans.use`` or the global one."""
    given = spans.given()
    provider = given if given is not None else trace.get_tracer_provider()
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        cached = _tracers[id(provider)] = (provider, provider.get_tracer(SCOPE))
    return cached[1]


def _theirs(task: Any, task_id: Any, publish: bool) -> Span | None:
    """The instrumentation's open span of this publish or run, if it has one."""
    utils = sys.modules.get(f"{spans.INSTRUMENTATION}.utils")
    if utils is None or task is None or not isinstance(task_id, str):
        return None
    found = utils.retrieve_context(task, task_id, is_publish=publish)
    return found[0] if found else None


def _attributes(**values: Any) -> dict[str, Any]:
    """``conventions.<name>`` attributes, those without a value left out."""
    names = {"message_id": "messaging.message.id", "queue": "messaging.destination.name"}
    return {
        names.get(name, f"conventions.{name}"): value
        for name, value in values.items()
        if value is not None and value != ""
    }


def traceparent(span: Span) -> str | None:
    """The W3C ``traceparent`` of ``span``, or None for a span that is not valid."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(hdr.TRACEPARENT)


def span_context(value: Any) -> SpanContext | None:
    """The span context a ``traceparent`` value names, or None."""
    if not isinstance(value, str):
        return None
    found = trace.get_current_span(_W3C.extract({hdr.TRACEPARENT: value})).get_span_context()
    return found if found.is_valid else None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__qualname__}: {scrub_text(str(exc))[:200]}"


# -- publish ----------------------------------------------------------------------------
@contextmanager
def publishing(task: Any) -> Iterator[Callable[[Any], None]]:
    """The publish span around a convention task's ``apply_async``; yields what notes
    its result (a deduplicated publish enqueued nothing)."""
    if spans.instrumented():
        yield lambda result: None
        return
    span = tracer().start_span(
        f"publish {task.name}", kind=SpanKind.PRODUCER,
        attributes={"messaging.system": "celery", **_attributes(
            task=task.name, version=version_of(task.name))},
    )  # fmt: skip
    token = _publishing.set(span)
    try:
        with trace.use_span(span, end_on_exit=True, record_exception=False,
                            set_status_on_exception=False):  # fmt: skip
            try:
                yield lambda result: span.set_attribute(
                    "conventions.deduplicated", bool(getattr(result, "deduplicated", False))
                )
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, _describe(exc)))
                raise
    finally:
        _publishing.reset(token)


def _name_publish(span: Span, headers: Mapping[str, Any], queue: Any) -> None:
    retries = headers.get("retries")
    span.set_attributes(_attributes(
        message_id=headers.get("id"), queue=queue if isinstance(queue, str) else None,
        idempotency_key=headers.get(hdr.IDEMPOTENCY_KEY),
        attempt=(retries if isinstance(retries, int) else 0) + 1,
        correlation_id=headers.get(hdr.CORRELATION),
    ))  # fmt: skip


def before_publish(task: Any, headers: dict[str, Any], queue: Any = None) -> None:
    """Name the message on its publish span and write the current context into its
    headers (the instrumentation writes its own when it is on)."""
    if spans.instrumented():
        theirs = _theirs(task, headers.get("id"), True)
        if theirs is not None:  # its hook ran before ours (else: ``after_publish``)
            _name_publish(theirs, headers, queue)
        return
    span = _publishing.get()
    if span is not None and span is trace.get_current_span():
        _name_publish(span, headers, queue)
    propagate.inject(headers)


def after_publish(task: Any, headers: Mapping[str, Any], queue: Any = None) -> None:
    """The instrumentation's publish span, when its hook runs after ours: named now,
    before its own after-publish hook ends it (the receivers of a signal run in the order
    they were connected, the same for both)."""
    if spans.instrumented():
        theirs = _theirs(task, headers.get("id"), True)
        if theirs is not None:
            _name_publish(theirs, headers, queue)


# -- run --------------------------------------------------------------------------------
@contextmanager
def running(delivery: Any) -> Iterator[None]:
    """The run span around one delivery (or the instrumentation's, annotated)."""
    task, request, headers = delivery.task, delivery.request, delivery.headers
    first = span_context(headers.get(hdr.FIRST_SPAN)) if delivery.attempt > 1 else None
    links = [Link(first, {"conventions.link": "first_attempt"})] if first else []
    if spans.instrumented():
        span = _theirs(task, request.id, False)
        if span is None:
            yield
            return
        for link in links:
            span.add_link(link.context, link.attributes)
        yield from _run(span, delivery)
        return
    span = tracer().start_span(
        f"run {task.name}", context=propagate.extract(request, getter=_REQUEST),
        kind=SpanKind.CONSUMER, links=links,
        attributes={"messaging.system": "celery", **_attributes(
            task=task.name, version=version_of(task.name), message_id=request.id,
            attempt=delivery.attempt, correlation_id=headers.get(hdr.CORRELATION))},
    )  # fmt: skip
    with trace.use_span(span, end_on_exit=True, record_exception=False,
                        set_status_on_exception=False):  # fmt: skip
        yield from _run(span, delivery)


def _run(span: Span, delivery: Any) -> Iterator[None]:
    headers = delivery.headers
    own = traceparent(span)
    if own:  # the retry carries the first; a dead letter keeps the run that failed
        headers[hdr.TRACEPARENT] = own
        if delivery.attempt == 1 or not headers.get(hdr.FIRST_SPAN):
            headers[hdr.FIRST_SPAN] = own
    try:
        yield
    except BaseException as exc:
        _decided(span, delivery, exc)
        raise
    _decided(span, delivery, None)


def _decided(span: Span, delivery: Any, exc: BaseException | None) -> None:
    decision = delivery.decision or _decision_of(exc)
    key = delivery.headers.get(hdr.IDEMPOTENCY_KEY) if delivery.key else None
    span.set_attributes(_attributes(
        task=delivery.task.name, version=version_of(delivery.task.name), attempt=delivery.attempt,
        idempotency_key=key, decision=decision,
        correlation_id=delivery.headers.get(hdr.CORRELATION), **{
            "dead_letter.category": delivery.category, "dead_letter.id": delivery.dead_letter_id,
        },
    ))  # fmt: skip
    if decision in ("retry", "dead_letter") or (exc is not None and decision == "error"):
        cause = getattr(exc, "exc", None) or exc  # a Retry carries the attempt's exception
        span.set_status(Status(StatusCode.ERROR, _describe(cause) if cause else decision))


def _decision_of(exc: BaseException | None) -> str:
    """The decision of a delivery that named none (an exception raised past the runner)."""
    if exc is None:
        return "succeeded"
    kind = type(exc).__name__
    if kind == "Retry":
        return "retry"
    if kind == "Ignore":
        return "ignore"
    if kind == "Reject":
        return "requeue" if getattr(exc, "requeue", False) else "reject"
    return "error"


# -- new traces -------------------------------------------------------------------------
@contextmanager
def new_trace(name: str, attributes: Mapping[str, Any], caused_by: Any = None) -> Iterator[None]:
    """A root span for the block (a replay, a beat occurrence): a trace of its own,
    linked to ``caused_by`` (a ``traceparent``) and to the caller's span, if any."""
    links = []
    if cause := span_context(caused_by):
        links.append(Link(cause, {"conventions.link": "caused_by"}))
    caller = trace.get_current_span().get_span_context()
    if caller.is_valid:
        links.append(Link(caller, {"conventions.link": "caller"}))
    span = tracer().start_span(
        name, context=otel_context.Context(), kind=SpanKind.INTERNAL, links=links,
        attributes=_attributes(**attributes),
    )  # fmt: skip
    with trace.use_span(span, end_on_exit=True, record_exception=False,
                        set_status_on_exception=False):  # fmt: skip
        yield
