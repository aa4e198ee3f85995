"""The steps of the transport's keys on the broker's Redis.

``transport_layout`` 1 recognizes the ``_cc.*`` keys every release before the stamp
wrote (:mod:`conventions.transport.layout`): nothing moves, the broker is stamped.
"""

from __future__ import annotations

from typing import Any

from conventions.upgrade.steps import Progress, Step, register


def _preview(place: Any, cursor: str | None) -> list[str]:
    return [f"stamp {place.stamp.where}: transport_layout 1 (keys stay as they are)"]


def _apply(place: Any, progress: Progress) -> list[str]:
    return _preview(place, progress.cursor)


STAMP = register(
    Step(
        "transport",
        "transport_layout",
        1,
        "recognize the transport's keys as layout 1",
        _preview,
        _apply,
    )
)
