"""The test kit: run your jobs through the layer's real run path, in your tests.

The pytest plugin (:mod:`conventions.testing.plugin`, loaded by itself once the package
is installed) gives the fixtures; this package gives the objects they return, also
usable without pytest (``JobKit.open``). See docs/howto/test-your-jobs.md.

The names below are imported when first used, so that loading the plugin (in every
pytest run of a project that installs the layer) costs no more than the plugin itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conventions.testing.capture import Published
    from conventions.testing.clock import VirtualClock
    from conventions.testing.drain import DrainLimit
    from conventions.testing.helpers import stopping
    from conventions.testing.kit import JobKit
    from conventions.testing.runner import Run
    from conventions.testing.schedules import Sent
    from conventions.testing.worker import real_worker

#: each public name and the module that defines it
_HOMES = {
    "DrainLimit": "drain",
    "JobKit": "kit",
    "Published": "capture",
    "Run": "runner",
    "Sent": "schedules",
    "VirtualClock": "clock",
    "real_worker": "worker",
    "stopping": "helpers",
}

__all__ = [
    "DrainLimit",
    "JobKit",
    "Published",
    "Run",
    "Sent",
    "VirtualClock",
    "real_worker",
    "stopping",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'conventions.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"conventions.testing.{home}"), name)
