"""Helpers for long jobs in tests: a shutdown that has begun, checkpoints, progress.

``stopping()`` makes ``ctx.is_stopping()`` true for the block, as the worker's warm
shutdown does (:mod:`conventions.worker.job_context`), so a test can see a job save its
checkpoint and stop (``ResumeLater``); the next delivery continues from it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conventions.observability import progress
from conventions.store.base import Store
from conventions.worker import job_context


@contextlib.contextmanager
def stopping() -> Iterator[None]:
    """Within the block this process is shutting down: ``ctx.is_stopping()`` is true."""
    flag = job_context._stopping
    was_set = flag.is_set()
    job_context.mark_stopping()
    try:
        yield
    finally:
        if not was_set:
            flag.clear()
            shared = job_context._shared
            if shared is not None:
                shared.value = 0


def checkpoint_of(store: Store, key: str) -> dict[str, Any] | None:
    """The checkpoint saved under idempotency key ``key`` (as ``ctx.idempotency_key``
    spells it), or None."""
    return store.get_state(progress.checkpoint_name(key))


def progress_of(store: Store, task_id: str) -> dict[str, Any] | None:
    """The last progress job ``task_id`` reported (``ctx.progress``), or None."""
    return progress.read_progress(store, task_id)
