"""A migration step, and the registry of every step the layer knows.

A step moves one format (``store_sql``, ``store_redis``, ``transport_layout``, the keys
of :data:`conventions.config.formats.READS_FROM`) of one kind of place to one version.
It says what it would change (``preview``, the dry run: reads only) and does it
(``apply``), returning what it changed, for the output and the audit trail. Both get the
cursor the step last saved (None: from the start), and ``apply`` may save one as it goes
(:class:`Progress`), so that a migrate killed inside it resumes there.

The layer's own steps register when their modules are imported (:func:`load`); a test
registers its own with :func:`register` (and removes it with :func:`unregister`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

#: the kinds of place: the store on Redis, the store on SQL, the transport's Redis
Kind = Literal["redis_store", "sql_store", "transport"]

#: the modules holding the layer's own steps, one per kind of place
MODULES: Final = (
    "conventions.upgrade.redis_store",
    "conventions.upgrade.sql_store",
    "conventions.upgrade.transport",
)


@dataclass
class Progress:
    """How far a step got: ``cursor`` (None: not started) and ``save`` (records a new
    cursor in the stamp, only while this migrate holds the lock)."""

    cursor: str | None
    save: Callable[[str], None] = field(repr=False)


@dataclass(frozen=True)
class Step:
    """One step: it moves ``format`` of a ``kind`` place to ``version``."""

    kind: Kind
    format: str
    version: int
    #: one line: what the step does
    title: str
    #: ``preview(place, cursor)``: what it would change (nothing is written)
    preview: Callable[[Any, str | None], list[str]]
    #: ``apply(place, progress)``: do it; what it changed
    apply: Callable[[Any, Progress], list[str]]

    @property
    def name(self) -> str:
        return f"{self.format} {self.version}"


_REGISTRY: list[Step] = []


def register(step: Step) -> Step:
    """Add ``step`` (a step of the same kind, format and version is replaced)."""
    unregister(step)
    _REGISTRY.append(step)
    return step


def unregister(step: Step) -> None:
    _REGISTRY[:] = [
        s
        for s in _REGISTRY
        if (s.kind, s.format, s.version) != (step.kind, step.format, step.version)
    ]


def load() -> list[Step]:
    """Every registered step (the layer's own imported first), by format and version."""
    for module in MODULES:
        importlib.import_module(module)
    return sorted(_REGISTRY, key=lambda s: (s.kind, s.format, s.version))
