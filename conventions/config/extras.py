"""The optional dependencies: imported where a feature needs them, never by the core.

The core install (``pip install celery-conventions``) is what a Redis user needs. A
feature that needs more names its extra when it is used without it::

    >>> require("sqlalchemy", "sql", "the SQL store")
    MissingExtra: the SQL store needs the 'sql' extra: pip install 'celery-conventions[sql]'

``loaded`` answers the other question, "is the application using this library?", without
importing it: a Sentry client can only be active when something imported ``sentry_sdk``.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from conventions.errors import MissingExtra

#: the distribution name, as ``pip install`` spells it
DISTRIBUTION = "celery-conventions"

#: each extra and the modules it provides (``pyproject.toml`` declares the same sets)
EXTRAS: dict[str, tuple[str, ...]] = {
    "sql": ("sqlalchemy", "psycopg"),
    "sentry": ("sentry_sdk",),
    "flower": ("flower",),
    "metrics": ("prometheus_client",),
    "django": ("django", "sqlalchemy", "psycopg"),
    "testing": ("pytest", "sqlalchemy"),
    "console": ("starlette", "jinja2", "uvicorn"),
    "otel": ("opentelemetry",),
}


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing(extra: str, feature: str) -> MissingExtra:
    """The one-line error for ``feature`` used without ``extra``."""
    return MissingExtra(f"{feature} needs the {extra!r} extra: {install_hint(extra)}", extra=extra)


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``; a ``MissingExtra`` naming ``extra`` when the
    module (or one it needs) is not installed.

    Only a missing module becomes ``MissingExtra``: an installed library that fails while
    importing raises its own error, which says more than "install it".
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise missing(extra, feature) from exc


def loaded(module: str) -> ModuleType | None:
    """``module`` if something in this process has imported it already, else None
    (never imports it)."""
    return sys.modules.get(module)
