"""Each priority step of a queue on Redis: its depth and its oldest job's age.

kombu keeps one list per priority step (:mod:`conventions.observability.queues` reads
``LLEN`` and ``LINDEX -1`` of each in one pipeline); with more than one step, the queue's
figures are also given per step, so that a starved level shows. With the layer's steps
(``[0, 3, 6]``, :mod:`conventions.jobs.priority`) a step is named by its level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from conventions.jobs import priority


@dataclass(frozen=True)
class LevelState:
    """One priority step of a queue, read when the queue has more than one."""

    #: the level (``high``, ``normal``, ``low`` with the layer's steps), else kombu's step
    priority: str
    #: messages waiting at this step
    depth: int
    #: seconds its oldest waiting job has been due (None: empty, or no time of its own)
    oldest_age: float | None


def read(
    steps: Sequence[int], replies: Sequence[Any], dues: Sequence[datetime | None], now: datetime
) -> tuple[LevelState, ...]:
    """The steps' states from the pipeline's replies for one queue (``LLEN``, ``LINDEX``
    per step, in ``steps`` order) and each head's due time, highest step first."""
    names = priority.STEP_NAMES if list(steps) == priority.STEPS else {}
    out = []
    for step, depth, due in zip(steps, replies[0::2], dues, strict=True):
        waiting = int(depth)
        age = None if due is None or not waiting else max(0.0, (now - due).total_seconds())
        out.append(LevelState(names.get(step, str(step)), waiting, age))
    return tuple(out)
