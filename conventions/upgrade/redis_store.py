"""The steps of the store on Redis.

``store_redis`` 1 recognizes the keys every release before the stamp wrote (the names
of :mod:`conventions.store.keys`): nothing moves, the store is stamped.
"""

from __future__ import annotations

from typing import Any

from conventions.upgrade.steps import Progress, Step, register


def _preview(place: Any, cursor: str | None) -> list[str]:
    return [f"stamp {place.stamp.where}: store_redis 1 (keys stay as they are)"]


def _apply(place: Any, progress: Progress) -> list[str]:
    return _preview(place, progress.cursor)


STAMP = register(
    Step(
        "redis_store", "store_redis", 1, "recognize the store's keys as layout 1", _preview, _apply
    )
)
