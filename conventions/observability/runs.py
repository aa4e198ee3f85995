"""Run history, the layer's side: what each audit event changes in its job's run record,
the log lines of the jobs that keep theirs, and the stuck runs an operator looks for.

The record itself lives in the store (:mod:`conventions.store.runs`) and is written with
the audit event that carries its change, never on its own (no added round trip).

Opting in to logs: ``runs.keep_logs(task)`` (or the decorator form over ``@app.job``):
the records a run of that task logs, at INFO or above, are kept (formatted and scrubbed,
at most :data:`MAX_BUFFERED` lines between two events, the store caps the record) and go
with the run's next audit event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from celery._state import get_current_task

from conventions.store import keys
from conventions.store import runs as records
from conventions.store.base import Store
from conventions.store.records import AuditEvent
from conventions.store.runs import Run
from conventions.tracing import headers as hdr
from conventions.tracing import logs, scrubbing

__all__ = ["Run", "keep_logs", "lapsed", "patch_for", "stuck"]

#: lines of one run held in memory between two of its events
MAX_BUFFERED = 200
#: runs whose lines are held at once, the oldest dropped first (lines logged after a
#: run's last event are never sent: this bounds what they hold)
MAX_RUNS_BUFFERED = 64

_kept: set[str] = set()
_buffers: dict[str, list[str]] = {}
_lock = threading.Lock()
_handler: list[logging.Handler] = []

T = TypeVar("T")


def patch_for(event: AuditEvent, headers: Mapping[str, Any]) -> dict[str, Any] | None:
    """The change ``event`` makes to its run (None: the event is no step of a run)."""
    worker, queue = _delivery(event.task_id)
    error = _error(event)
    kept = event.task in _kept
    if kept and event.event == "started":
        _install()  # again: a worker's logging setup may have cleared the root's handlers
    return records.patch(
        event.event, event.task, event.task_id, event.at, event.attempt,
        detail=event.detail,
        once={
            "key": event.idempotency_key, "correlation_id": event.correlation_id,
            "causation_id": event.causation_id, "actor": headers.get(hdr.ACTOR),
            "queue": queue,
        },
        worker=worker if event.event == "started" else None,
        error=error,
        logs=_take_lines(event.task_id) if kept else None,
    )  # fmt: skip


def _delivery(task_id: str) -> tuple[str | None, str | None]:
    """The worker and queue of the delivery running now, when it is ``task_id``'s."""
    current = get_current_task()
    request = getattr(current, "request", None)
    if request is None or getattr(request, "id", None) != task_id:
        return None, None
    info = getattr(request, "delivery_info", None) or {}
    queue = info.get("routing_key") or info.get("queue")
    return getattr(request, "hostname", None), (str(queue) if queue else None)


def _error(event: AuditEvent) -> str | None:
    detail = event.detail
    if event.event not in ("retried", "retry_failed", "dead_lettered", "deferred"):
        return None
    parts = [str(detail[name]) for name in ("exc_type", "reason") if detail.get(name)]
    return scrubbing.scrub_text(": ".join(parts)) if parts else None


# -- logs --------------------------------------------------------------------------------
def keep_logs(task: T) -> T:
    """Keep the log lines of ``task``'s runs in its run record (the seed's ``LogAlways``);
    ``task`` is a job (or its name). Returns it, so it also decorates ``@app.job``."""
    name = task if isinstance(task, str) else str(getattr(task, "name", ""))
    if not name:
        raise ValueError("keep_logs takes a job or a job's name")
    _kept.add(name)
    _install()
    return task


class _RunLines(logging.Handler):
    """Holds the lines of the runs of kept tasks, by task id."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        fields = logs.current_fields()
        task_id, task = fields.get("task_id"), fields.get("task")
        if not task_id or task not in _kept:
            return
        try:
            line = scrubbing.scrub_text(self.format(record))[: records.MAX_LINE]
        except Exception:
            return
        with _lock:
            lines = _buffers.get(task_id)
            if lines is None:
                if len(_buffers) >= MAX_RUNS_BUFFERED:
                    _buffers.pop(next(iter(_buffers)))
                lines = _buffers[task_id] = []
            if len(lines) < MAX_BUFFERED:
                lines.append(line)


def _install() -> None:
    """The handler on the root logger (once; put back if a logging setup removed it)."""
    root = logging.getLogger()
    with _lock:
        if not _handler:
            _handler.append(_RunLines())
        if _handler[0] not in root.handlers:
            root.addHandler(_handler[0])


def _take_lines(task_id: str) -> list[str] | None:
    with _lock:
        return _buffers.pop(task_id, None)


# -- stuck runs ------------------------------------------------------------------------
def lapsed(store: Store, run: Run) -> bool:
    """Whether a running run's ledger claim is gone: no live lease holds its key (its
    worker died, or the lease ran out while the body ran)."""
    if run.state != "running" or not run.key:
        return False
    state = store.key_state(keys.namespaced(run.task, run.key))
    return state.ledger_state != "running"


def stuck(
    store: Store,
    running: Iterable[Run],
    time_limit: Callable[[str], float | None],
    now: datetime | None = None,
) -> list[tuple[Run, str]]:
    """The running runs that are stuck, each with why: past ``time_limit(task)`` seconds
    since their attempt started, or holding no live lease (:func:`lapsed`)."""
    now = now or datetime.now(UTC)
    found = []
    for run in running:
        if run.state != "running":
            continue
        started = run.attempts[-1].started_at if run.attempts else None
        limit = time_limit(run.task)
        if started is not None and limit and now - started > timedelta(seconds=limit):
            found.append((run, f"running past its time limit ({limit:g}s)"))
        elif lapsed(store, run):
            found.append((run, "its ledger lease has lapsed"))
    return found
