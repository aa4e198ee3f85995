"""Whether the layer opens OpenTelemetry spans, decided without importing OpenTelemetry.

Every publish and every run asks :func:`active`. The spans themselves are in
:mod:`conventions.tracing.otel` (the ``otel`` extra), loaded the first time they are on.
They are on in a process that has imported OpenTelemetry's API and set a tracer
provider (``trace.set_tracer_provider``: what ``opentelemetry-instrument`` and every SDK
setup do), or gave the layer one (:func:`use`), or instruments Celery with
``opentelemetry-instrumentation-celery``. Elsewhere a publish or a run pays one
dictionary look-up (the API not imported) or one check of the global provider (imported,
as FastAPI does, but nothing set up).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from conventions.config import extras

#: the module whose presence says OpenTelemetry may be in use in this process
_API = "opentelemetry.trace"
#: the spans module, once loaded
_loaded: list[ModuleType] = []


def active() -> ModuleType | None:
    """:mod:`conventions.tracing.otel` when this process traces, else None (never
    imports OpenTelemetry)."""
    if _API not in sys.modules:
        return None
    module = _loaded[0] if _loaded else load()
    return module if module.enabled() else None


def load() -> ModuleType:
    """The spans module; ``MissingExtra`` naming the ``otel`` extra without OpenTelemetry."""
    if not _loaded:
        _loaded.append(extras.require("conventions.tracing.otel", "otel", "OpenTelemetry traces"))
    return _loaded[0]


def use(tracer_provider: Any) -> None:
    """Send the layer's spans to ``tracer_provider`` (an SDK ``TracerProvider``) instead of
    the global one, as ``CeleryInstrumentor().instrument(tracer_provider=...)`` does for
    its own; ``None`` goes back to the global provider."""
    load().use(tracer_provider)
