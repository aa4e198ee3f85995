"""Test-only jobs and helpers for the OpenTelemetry traces: a job that publishes a child,
one that is dead-lettered unless replayed, and the span tree as the docs show it.

Imported by ``test_otel`` before its thread worker starts (the worker knows its tasks
at start).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from conventions import Backoff, Id, JobContext, Payload, PermanentError, TransientError
from tasks import app
from tests.integration.support_jobs import echo


class Order(Payload):
    order_id: Id


@app.job("testing.otel_parent.v1", payload=Order, key="otel-parent:{order_id}", workload="email")
def otel_parent(payload: Order, ctx: JobContext) -> str:
    """Publishes one child job and returns its id."""
    return str(echo.delay(call_id=f"{payload.order_id}-child").id)


@app.job("testing.otel_declined.v1", payload=Order, key="otel-charge:{order_id}", workload="email")
def otel_declined(payload: Order, ctx: JobContext) -> str:
    """Dead-lettered as permanent, unless it runs as a replay."""
    if ctx.replay_of is None:
        raise PermanentError(f"card declined for {payload.order_id}")
    return "charged"


@app.job(
    "testing.otel_flaky_decline.v1", payload=Order, key="otel-flaky:{order_id}",
    workload="email", backoff=Backoff(base=0.2, cap=1.0, max_attempts=5),
)  # fmt: skip
def otel_flaky_decline(payload: Order, ctx: JobContext) -> None:
    """Fails transiently on its first attempt, and for good on its second."""
    if ctx.attempt == 1:
        raise TransientError("provider busy")
    raise PermanentError(f"card declined for {payload.order_id}")


#: the attributes the tree shows, in this order
SHOWN = ("attempt", "idempotency_key", "decision", "dead_letter.category")


def attr(span: Any, name: str) -> Any:
    return span.attributes.get(f"conventions.{name}")


def in_trace(spans: Iterable[Any], trace_id: int) -> list[Any]:
    return [s for s in spans if s.context.trace_id == trace_id]


def tree(spans: Sequence[Any]) -> str:
    """The spans as an indented tree, one line each: name, kind, the layer's attributes
    and the links (to the span they point at, by its name and attempt)."""
    by_id = {s.context.span_id: s for s in spans}
    children: dict[int | None, list[Any]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent if parent in by_id else None, []).append(span)
    lines: list[str] = []

    def show(span: Any, depth: int) -> None:
        shown = " ".join(
            f"{name}={attr(span, name)}" for name in SHOWN if attr(span, name) is not None
        )
        kind = span.kind.name
        line = f"{'    ' * depth}{span.name}  [{kind}] {shown}".rstrip()
        for link in span.links:
            target = by_id.get(link.context.span_id)
            what = (link.attributes or {}).get("conventions.link", "link")
            named = f"{target.name} attempt={attr(target, 'attempt')}" if target else "elsewhere"
            line += f"  (link {what} -> {named})"
        lines.append(line)
        for child in children.get(span.context.span_id, []):
            show(child, depth + 1)

    for root in children.get(None, []):
        show(root, 0)
    return "\n".join(lines)
