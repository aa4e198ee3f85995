"""What a job body gets besides its payload: the job context (and the stop flag).

The body is ``def body(payload, ctx)``. ``ctx`` carries the idempotency key to hand to
providers (an ``Idempotency-Key`` header, a deterministic Message-ID), the attempt, the
correlation context, ``is_stopping()`` for long jobs that should stop at a clean
point during a deploy, ``progress(done, total, note)`` and ``checkpoint`` (a cursor
saved under the idempotency key, see ``conventions.observability.progress``).

The stop flag lives in shared memory made in the worker's main process before the
pool forks (``share_stopping``), so prefork children see the warm shutdown the main
process received; threads and the solo pool read the same flag.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import RawValue
from typing import Any

from conventions.observability.progress import Checkpoint, Progress
from conventions.store.base import Store
from conventions.tracing.context import Trace

logger = logging.getLogger("conventions.worker.job_context")

_stopping = threading.Event()
#: the stop flag shared with prefork children (a byte in shared memory), once made
_shared: Any = None


def share_stopping() -> None:
    """Make the shared stop flag; call in the worker's main process before the pool
    forks (``worker_init``), so every child inherits it."""
    global _shared  # noqa: PLW0603  (one flag per worker, inherited by fork)
    if _shared is None:
        _shared = RawValue("b", 0)


def mark_stopping() -> None:
    """Called when the worker starts a warm shutdown: running jobs see ``is_stopping()``,
    in this process and in every child that inherited the shared flag."""
    _stopping.set()
    if _shared is not None:
        _shared.value = 1


def stopping() -> bool:
    """True once this worker is shutting down."""
    return _stopping.is_set() or (_shared is not None and bool(_shared.value))


@dataclass
class JobContext:
    """The running job, as its body sees it."""

    task: str
    task_id: str
    #: stable across retries, redeliveries and replays: give it to providers
    idempotency_key: str
    #: 1 on the first run, 2 on the first retry, ...
    attempt: int
    trace: Trace
    #: True when the previous attempt ended with an uncertain outcome: reconcile first
    reconcile_first: bool = False
    #: the dead-letter id this run was replayed from, if any
    replay_of: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    #: the layer's store (progress and checkpoints); None outside a worker
    store: Store | None = None
    #: publishes a progress document to the result backend (``PROGRESS`` state)
    publish_progress: Callable[[dict[str, Any]], None] | None = None
    #: how long a checkpoint is kept after its last save (seconds)
    checkpoint_keep: float = 7 * 86400.0
    _progress: Progress | None = field(default=None, init=False, repr=False)
    _checkpoint: Checkpoint | None = field(default=None, init=False, repr=False)
    #: another reason to stop besides a shutdown (a newer ``replace`` schedule occurrence)
    stop_check: Callable[[], bool] | None = None

    @property
    def correlation_id(self) -> str:
        return self.trace.correlation_id

    def is_stopping(self) -> bool:
        """True once the worker is shutting down (or a newer occurrence of a ``replace``
        schedule entry wants to run): save a checkpoint, then raise ``ResumeLater`` (or
        return) soon; the job gets the worker's shutdown grace."""
        return stopping() or (self.stop_check is not None and self.stop_check())

    def progress(self, done: int, total: int | None = None, note: str = "") -> dict[str, Any]:
        """Report progress (throttled, never backwards): ``conventions status``, the
        result backend's ``PROGRESS`` state and Flower show it."""
        if self._progress is None:
            self._progress = Progress(
                self._store(), self.task, self.task_id, publish=self.publish_progress
            )
        return self._progress.report(done, total, note)

    @property
    def checkpoint(self) -> Checkpoint:
        """The cursor saved under this job's idempotency key: ``.load()``, ``.save(...)``."""
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self._store(), self.idempotency_key, self.checkpoint_keep)
        return self._checkpoint

    def finish(self) -> None:
        """The job succeeded: its checkpoint, if it used one, is not needed any more."""
        if self._checkpoint is not None:
            try:
                self._checkpoint.clear()
            except Exception:
                logger.warning("could not delete the checkpoint of %s", self.idempotency_key)

    def _store(self) -> Store:
        if self.store is None:
            raise RuntimeError("progress and checkpoints need the store: run the job in a worker")
        return self.store
