"""OpenTelemetry traces through a real worker (in-process threads, so that the SDK's
in-memory exporter sees the worker's spans): a retry links to the first attempt, a
child job's publish is a child of its parent's run, a replay starts a trace linked to
the run that was dead-lettered, and beside ``opentelemetry-instrumentation-celery``
each publish and run has one span, the instrumentation's, with the layer's attributes.

The SDK is real (``TracerProvider``, ``SimpleSpanProcessor``, ``InMemorySpanExporter``);
it is given to the layer with ``spans.use`` rather than set globally, which can be done
once per process and would reach every later test.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from conventions.ops.replay import replay
from conventions.schedules import beat
from conventions.tracing import spans
from tasks import app
from tests.acceptance import support_schedules
from tests.integration.helpers import wait_for
from tests.integration.support_otel import (
    attr,
    in_trace,
    otel_declined,
    otel_flaky_decline,
    otel_parent,
    tree,
)
from tests.integration.support_tracing import flaky_fanout

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

FANOUT = "testing.flaky_fanout.v1"
TICK = support_schedules.TWO_BEATS[0]  # tick, every minute, testing.sched_tick.v1


@pytest.fixture(scope="module")
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    spans.use(provider)
    yield provider
    spans.use(None)
    provider.shutdown()


@pytest.fixture
def exporter(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # its processor exports nothing more


def finished(exporter: InMemorySpanExporter, kind: SpanKind, task_id: str) -> list[Any]:
    """The finished spans of one job (its publishes or its runs), oldest first."""
    found = [
        s for s in exporter.get_finished_spans()
        if s.kind is kind and s.attributes.get("messaging.message.id") == task_id
    ]  # fmt: skip
    return sorted(found, key=lambda s: s.start_time or 0)


def runs_until(
    exporter: InMemorySpanExporter, task_id: str, done: Callable[[list[Any]], bool]
) -> list[Any]:
    def check() -> list[Any] | None:
        runs = finished(exporter, SpanKind.CONSUMER, task_id)
        return runs if runs and done(runs) else None

    return wait_for(check, timeout=30)


def parent_of(span: Any, exporter: InMemorySpanExporter) -> Any:
    assert span.parent is not None, f"{span.name} is a root"
    (found,) = [
        s for s in exporter.get_finished_spans() if s.context.span_id == span.parent.span_id
    ]
    return found


def test_a_retried_job_is_one_trace_whose_later_attempts_link_to_the_first(
    exporter: InMemorySpanExporter, capsys: pytest.CaptureFixture[str]
) -> None:
    root = flaky_fanout.delay(order_id=f"ord_{uuid.uuid4().hex[:8]}")
    children = root.get(timeout=60)
    runs = runs_until(exporter, root.id, lambda r: attr(r[-1], "decision") == "succeeded")
    for child in children:
        runs_until(exporter, child, lambda r: attr(r[-1], "decision") == "succeeded")
    [first_publish, *_] = finished(exporter, SpanKind.PRODUCER, root.id)

    assert first_publish.parent is None  # published by a script: a new trace
    assert [attr(r, "attempt") for r in runs] == [1, 2, 3]
    assert [attr(r, "decision") for r in runs] == ["retry", "retry", "succeeded"]
    assert {r.context.trace_id for r in runs} == {first_publish.context.trace_id}
    assert len({attr(r, "idempotency_key") for r in runs}) == 1
    assert attr(runs[0], "idempotency_key").startswith("fanout:ord_")
    assert runs[0].links == ()
    for later in runs[1:]:
        assert [link.context.span_id for link in later.links] == [runs[0].context.span_id]
        # the retry was published from inside the attempt before it
        assert parent_of(parent_of(later, exporter), exporter).kind is SpanKind.CONSUMER
    with capsys.disabled():
        print("\n" + tree(in_trace(exporter.get_finished_spans(), first_publish.context.trace_id)))


def test_a_child_jobs_publish_is_a_child_of_its_parents_run(exporter: InMemorySpanExporter) -> None:
    parent = otel_parent.delay(order_id=f"ord_{uuid.uuid4().hex[:8]}")
    child_id = parent.get(timeout=30)
    [child_run] = runs_until(exporter, child_id, lambda r: attr(r[-1], "decision") == "succeeded")
    [parent_run] = finished(exporter, SpanKind.CONSUMER, parent.id)

    child_publish = parent_of(child_run, exporter)
    assert (
        child_publish.kind is SpanKind.PRODUCER and child_publish.name == "publish testing.echo.v1"
    )
    assert parent_of(child_publish, exporter) is not None
    assert child_publish.parent.span_id == parent_run.context.span_id
    assert child_run.context.trace_id == parent_run.context.trace_id
    assert attr(child_publish, "idempotency_key") == attr(child_run, "idempotency_key")
    assert attr(parent_run, "version") == "v1" and attr(parent_run, "task") == otel_parent.name


def test_a_replay_starts_a_trace_linked_to_the_run_that_was_dead_lettered(
    exporter: InMemorySpanExporter,
) -> None:
    failed = otel_declined.delay(order_id=f"ord_{uuid.uuid4().hex[:8]}")
    [dead] = runs_until(exporter, failed.id, lambda r: attr(r[-1], "decision") == "dead_letter")
    assert attr(dead, "dead_letter.category") == "permanent"
    record_id = attr(dead, "dead_letter.id")

    again = replay(app, record_id, reason="card updated", actor="ops")
    [rerun] = runs_until(exporter, again.id, lambda r: attr(r[-1], "decision") == "succeeded")
    publish = parent_of(rerun, exporter)
    root = parent_of(publish, exporter)

    assert root.name == f"replay {otel_declined.name}" and root.parent is None
    assert root.context.trace_id != dead.context.trace_id  # a trace of its own
    [link] = root.links
    assert (link.context.trace_id, link.context.span_id) == (
        dead.context.trace_id, dead.context.span_id,
    )  # fmt: skip
    assert attr(root, "dead_letter.id") == record_id and attr(root, "actor") == "ops"
    assert attr(rerun, "idempotency_key") == attr(dead, "idempotency_key")


def test_a_beat_occurrence_is_a_trace_of_its_own_holding_its_publish_and_run(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.conf, "conventions_schedule", support_schedules.TWO_BEATS)
    occurrence = TICK.occurrence(dt.datetime(2026, 12, 2, 5, 0, tzinfo=dt.UTC))
    sent = beat.send(app, TICK, occurrence)
    assert sent is not None
    [run] = runs_until(exporter, sent.id, lambda r: attr(r[-1], "decision") == "succeeded")
    root = parent_of(parent_of(run, exporter), exporter)

    assert root.name == "beat tick" and root.parent is None and root.links == ()
    assert attr(root, "schedule") == "tick"
    assert attr(root, "occurrence") == occurrence.at.isoformat()
    assert attr(run, "idempotency_key") == occurrence.key


def test_a_worker_without_a_tracer_carries_the_traceparent_through_a_retry(
    provider: TracerProvider,
) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    spans.use(None)  # no provider given, none set: this process traces nothing
    try:
        assert spans.active() is None
        job = otel_flaky_decline.apply_async(
            kwargs={"order_id": f"ord_{uuid.uuid4().hex[:8]}"},
            headers={"traceparent": traceparent},
        )

        def dead_letter() -> Any:
            found = app.store.list_dead_letters(task=otel_flaky_decline.name, limit=10)
            return next((r for r in found if r.task_id == job.id), None)

        record = wait_for(dead_letter, timeout=30)
    finally:
        spans.use(provider)
    assert record.attempts == 2
    assert record.headers["traceparent"] == traceparent  # the second attempt's message


def test_beside_the_celery_instrumentation_each_publish_and_run_has_one_span_with_our_attributes(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        root = flaky_fanout.delay(order_id=f"ord_{uuid.uuid4().hex[:8]}")
        children = root.get(timeout=60)
        runs = runs_until(exporter, root.id, lambda r: len(r) == 3)
        for child in children:
            runs_until(exporter, child, bool)
    finally:
        instrumentor.uninstrument()
    everything = exporter.get_finished_spans()
    publishes = finished(exporter, SpanKind.PRODUCER, root.id)

    assert not [s for s in everything if s.name.startswith(("publish ", "run "))]  # none of ours
    assert [s.name for s in publishes] == [f"apply_async/{FANOUT}"] * 3
    assert [s.name for s in runs] == [f"run/{FANOUT}"] * 3
    assert [attr(s, "attempt") for s in publishes] == [1, 2, 3]
    assert [attr(r, "decision") for r in runs] == ["retry", "retry", "succeeded"]
    assert len({attr(s, "correlation_id") for s in [*publishes, *runs]}) == 1
    assert {attr(s, "idempotency_key") for s in [*publishes, *runs]} == {
        attr(runs[0], "idempotency_key")
    }
    for later in runs[1:]:
        assert [link.context.span_id for link in later.links] == [runs[0].context.span_id]
    for run in runs:  # one trace, each run a child of its own publish
        assert parent_of(run, exporter) in publishes
