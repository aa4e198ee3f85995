"""Progress and checkpoints of long jobs, kept as small state documents in the store.

``ctx.progress(done, total, note)`` writes ``progress:{task id}`` (throttled: cheap
enough to call per row) and the ``PROGRESS`` state into the result backend, which
Flower shows and ``conventions status TASK_ID`` reads. It never goes backwards: a job
that resumes from an older checkpoint (after a crash) reports at least what was
already reported, so a watcher sees a job that only moves forward.

``ctx.checkpoint`` saves and reads a cursor under the idempotency key
(``checkpoint:{key}``), so every delivery of the same job (a retry, a redelivery after
a crash, a resume after a deploy, a replay) continues where the last one stopped. The
runner deletes it when the job succeeds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from conventions.store.base import Store
from conventions.store.records import utcnow

logger = logging.getLogger("conventions.observability.progress")

#: the Celery state a running job reports its progress under (Flower shows it)
PROGRESS_STATE = "PROGRESS"
#: how long a progress document outlives its last update (seconds)
PROGRESS_KEEP = 7 * 86400.0
#: at most one progress write per this many seconds (the last one, done == total, always)
PROGRESS_EVERY = 0.5


def progress_name(task_id: str) -> str:
    """The state document holding the progress of job ``task_id``."""
    return f"progress:{task_id}"


def checkpoint_name(key: str) -> str:
    """The state document holding the checkpoint of idempotency key ``key``."""
    return f"checkpoint:{key}"


def read_progress(store: Store, task_id: str) -> dict[str, Any] | None:
    """The last progress a job reported, or None."""
    return store.get_state(progress_name(task_id))


class Progress:
    """Reports the progress of one running job (``ctx.progress`` calls it)."""

    def __init__(
        self,
        store: Store,
        task: str,
        task_id: str,
        publish: Callable[[dict[str, Any]], None] | None = None,
        every: float = PROGRESS_EVERY,
    ) -> None:
        self.store, self.task, self.task_id = store, task, task_id
        self.publish = publish
        self.every = every
        self._floor: int | None = None
        self._last_write = 0.0

    def report(self, done: int, total: int | None = None, note: str = "") -> dict[str, Any]:
        """Record ``done`` of ``total`` (never less than already reported); returns the
        document. A failed write is logged, never raised: progress is for watching."""
        if self._floor is None:
            self._floor = self._stored_done()
        done = max(int(done), self._floor)
        self._floor = done
        document: dict[str, Any] = {
            "task": self.task,
            "task_id": self.task_id,
            "done": done,
            "total": total,
            "percent": round(100.0 * done / total, 1) if total else None,
            "note": note,
            "updated_at": utcnow().isoformat(),
        }
        now = time.monotonic()
        finished = total is not None and done >= total
        if not finished and now - self._last_write < self.every:
            return document
        self._last_write = now
        try:
            self.store.put_state(progress_name(self.task_id), document, PROGRESS_KEEP)
            if self.publish is not None:
                self.publish(document)
        except Exception:
            logger.warning("%s[%s]: could not record progress", self.task, self.task_id,
                           exc_info=True)  # fmt: skip
        return document

    def _stored_done(self) -> int:
        try:
            previous = read_progress(self.store, self.task_id)
        except Exception:
            logger.warning("could not read the progress of %s", self.task_id, exc_info=True)
            return 0
        return int(previous.get("done") or 0) if previous else 0


class Checkpoint:
    """The saved cursor of one job, under its idempotency key."""

    def __init__(self, store: Store, key: str, keep: float) -> None:
        self.store = store
        self.key = key
        self.keep = keep

    @property
    def name(self) -> str:
        return checkpoint_name(self.key)

    def load(self) -> dict[str, Any] | None:
        """The last saved cursor, or None on a fresh start."""
        return self.store.get_state(self.name)

    def save(self, cursor: Mapping[str, Any]) -> None:
        """Save ``cursor`` (a small JSON mapping). Save only after the work it covers is
        committed: a crash between the two repeats that work, so make it idempotent."""
        self.store.put_state(self.name, dict(cursor), self.keep)

    def clear(self) -> None:
        self.store.delete_state(self.name)
