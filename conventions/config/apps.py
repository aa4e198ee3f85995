"""The app a ``MODULE[:ATTR]`` spec names: the CLI's ``-A`` and the test kit's ``cc_app``.

``tasks`` alone means ``tasks.app`` (Celery's ``-A tasks`` reads the same attribute).
Each caller turns a failure into its own kind of error (the CLI's one line and exit 2,
pytest's usage error with the ``pythonpath`` hint).
"""

from __future__ import annotations

import importlib
from typing import Any

#: the attribute a spec without ``:ATTR`` names
DEFAULT_ATTRIBUTE = "app"


def split(spec: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``spec``."""
    module, _, attribute = spec.partition(":")
    return module, attribute or DEFAULT_ATTRIBUTE


def import_spec(spec: str) -> Any:
    """The object ``spec`` names. Raises what the import raises (``ImportError``,
    ``ModuleNotFoundError``), or ``AttributeError`` when the module has no such name."""
    module, attribute = split(spec)
    return getattr(importlib.import_module(module), attribute)
