"""When the layer traces: only in a process with a tracer provider (set, given, or the
Celery instrumentation on); elsewhere nothing of OpenTelemetry is loaded by it, even
where the API is imported (redis-py and FastAPI import it wherever it is installed).

Each case runs in a fresh interpreter: a global tracer provider can be set once per
process, and what is imported is the question."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conventions.tracing import headers as hdr


def run(code: str) -> str:
    command = [sys.executable, "-c", textwrap.dedent(code)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_with_the_api_imported_but_no_provider_nothing_is_traced_or_loaded() -> None:
    out = run("""
        import sys
        import opentelemetry.trace
        from conventions.tracing import spans
        print(spans.active(), "conventions.tracing.otel" in sys.modules)
    """)
    assert out == "None False"


def test_a_global_provider_or_one_given_turns_the_spans_on() -> None:
    out = run("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from conventions.tracing import spans
        trace.set_tracer_provider(TracerProvider())
        print(spans.active().__name__)
    """)
    assert out == "conventions.tracing.otel"
    out = run("""
        import opentelemetry.trace
        from opentelemetry.sdk.trace import TracerProvider
        from conventions.tracing import spans
        spans.use(TracerProvider())
        on = spans.active() is not None
        spans.use(None)
        print(on, spans.active())
    """)
    assert out == "True None"


@pytest.mark.parametrize(
    "value",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-0f",
    ],
)
def test_a_w3c_traceparent_is_read_as_it_is(value: str) -> None:
    assert hdr.read_header(hdr.TRACEPARENT, value) == value
    assert hdr.read_header(hdr.FIRST_SPAN, value) == value


@pytest.mark.parametrize(
    "value",
    [
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-4bf92f3577b34da6a3ce929d0e0e4736-01",
        ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
        "x" * 500,
    ],
)
def test_a_traceparent_of_the_wrong_form_is_refused(value: object) -> None:
    assert hdr.read_header(hdr.TRACEPARENT, value, warn=False) is None
