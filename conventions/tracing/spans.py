"""Whether the layer opens OpenTelemetry spans, decided without importing OpenTelemetry.

Every publish and every run asks :func:`active`. The spans themselves are in
:mod:`conventions.tracing.otel` (the ``otel`` extra), loaded the first time they are on.
They are on in a process that has imported OpenTelemetry's API and set a tracer
provider (``trace.set_tracer_provider``: what ``opentelemetry-instrument`` and every SDK
setup do), or gave the layer one (:func:`use`), or instruments Celery with
``opentelemetry-instrumentation-celery``. Elsewhere a publish or a run pays a dictionary
look-up or two, and nothing is imported: not even where the API is imported but unused,
as redis-py and FastAPI import it wherever it is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

from conventions.config import extras

#: the module whose presence says OpenTelemetry may be in use in this process
API = "opentelemetry.trace"
#: the instrumentation whose spans the layer annotates instead of opening its own
INSTRUMENTATION = "opentelemetry.instrumentation.celery"

#: the spans module, once loaded
_loaded: list[ModuleType] = []
#: the tracer provider given to :func:`use`
_given: list[Any] = []
#: whether the instrumentation is installed, once looked up
_installed: list[bool] = []
#: the instrumentor (one per process: ``BaseInstrumentor`` is a singleton), once imported
_instrumentor: list[Any] = []


def active() -> ModuleType | None:
    """:mod:`conventions.tracing.otel` when this process traces, else None."""
    api = sys.modules.get(API)
    if api is None:
        return None
    if _given or _provider_set(api) or instrumented():
        return _loaded[0] if _loaded else load()
    return None


def _provider_set(api: ModuleType) -> bool:
    """Whether a global tracer provider is set. Read as it is: ``get_tracer_provider()``
    reads the environment on each call while none is set (a microsecond a publish)."""
    provider = getattr(api, "_TRACER_PROVIDER", None)
    return provider is not None and type(provider).__name__ != "NoOpTracerProvider"


def instrumented() -> bool:
    """Whether ``opentelemetry-instrumentation-celery`` is instrumenting (never imports it)."""
    if not _instrumentor:
        module = sys.modules.get(INSTRUMENTATION)
        if module is None:
            return False
        _instrumentor.append(module.CeleryInstrumentor())
    return bool(_instrumentor[0].is_instrumented_by_opentelemetry)


def instrumentation_installed() -> bool:
    """Whether ``opentelemetry-instrumentation-celery`` is installed (looked up once per
    process, without importing it): an app connects its ``after_task_publish`` receiver
    only then."""
    if not _installed:
        try:
            found = importlib.util.find_spec(INSTRUMENTATION) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken one
            found = False
        _installed.append(found)
    return _installed[0]


def given() -> Any:
    """The tracer provider given to :func:`use`, or None (the global one)."""
    return _given[0] if _given else None


def load() -> ModuleType:
    """The spans module; ``MissingExtra`` naming the ``otel`` extra without OpenTelemetry."""
    if not _loaded:
        _loaded.append(extras.require("conventions.tracing.otel", "otel", "OpenTelemetry traces"))
    return _loaded[0]


def use(tracer_provider: Any) -> None:
    """Send the layer's spans to ``tracer_provider`` (an SDK ``TracerProvider``) instead of
    the global one, as ``CeleryInstrumentor().instrument(tracer_provider=...)`` does for
    its own; ``None`` goes back to the global provider."""
    load()  # MissingExtra here, at set-up, rather than at the first publish
    _given[:] = [] if tracer_provider is None else [tracer_provider]
