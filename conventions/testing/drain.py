"""Drain: run the captured jobs, and the jobs they publish, on the virtual clock.

Each step takes the pending message due first. When it is due later than the virtual
now (a retry's countdown, a deferral, an ``eta``), the clock jumps to its ETA: a job that
fails three times with a transient error and succeeds on the fourth attempt is drained in
one call, its backoff spent in virtual seconds, never slept. Messages of tasks the app
does not register (``send_task`` to another app's workers) stay enqueued. The drain
stops when nothing is pending, after ``max_runs`` deliveries (a job that retries for
ever is a finding, not a hang), or at ``until`` (virtual time: later ones stay pending).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from conventions.store.base import Store
from conventions.testing.capture import Capture, Published, task_name
from conventions.testing.runner import Run, run_message

#: deliveries one drain runs at most, unless told otherwise
MAX_RUNS = 100


class DrainLimit(AssertionError):
    """The drain ran ``max_runs`` deliveries and jobs were still pending."""


def drain(
    app: Any,
    capture: Capture,
    store: Store,
    *,
    task: Any = None,
    max_runs: int = MAX_RUNS,
    until: datetime | float | None = None,
    strict: bool = True,
) -> list[Run]:
    """Run pending jobs (of ``task`` only, when given) until none is left; returns the
    runs in order. ``until``: a virtual moment, or seconds from now, past which nothing
    runs. ``strict``: raise :class:`DrainLimit` when ``max_runs`` is reached with jobs
    still pending (else return what ran)."""
    clock = capture.clock
    limit = clock.now() + timedelta(seconds=until) if isinstance(until, int | float) else until
    name = task_name(task)
    registered = app.tasks

    def wanted(item: Published) -> bool:  # another app's jobs stay enqueued: not ours to run
        return item.name in registered and (name is None or item.name == name)

    runs: list[Run] = []
    while True:
        capture.collect()
        candidates = [item for item in capture.pending if wanted(item)]
        if not candidates:
            return runs
        job = min(candidates, key=lambda item: (item.due_at(), item.seq))
        if limit is not None and job.due_at() > limit:
            clock.advance_to(limit)
            return runs
        if len(runs) >= max_runs:
            if strict:
                left = ", ".join(f"{item.name}[{item.task_id}]" for item in candidates[:5])
                raise DrainLimit(f"{max_runs} deliveries ran and jobs are still pending: {left}")
            return runs
        clock.advance_to(job.due_at())
        runs.append(run_message(app, capture, store, job))
