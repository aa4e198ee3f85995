"""Trigger-and-poll for user-facing jobs: publish, answer at once, poll for progress.

A web request that starts a long job should not wait for it. :func:`trigger` publishes
and returns the run id at once (the job's task id; for a duplicate of a job still
pending, the id of the job that holds the key, so a double click follows one run).
:func:`run_state` reads that run's state, progress and result for a progress bar,
cheaply enough to poll every second or two: one result-backend read and one store read.

The two reads are not one snapshot: a job can start between them. The state is read
first, and when it still says ``queued`` while a progress document is already there, the
job started meanwhile (its body writes progress only after its claim recorded STARTED),
so the state is read once more, and the progress too when that state is final. A poll
never shows a run as ``queued`` next to the progress of its running body.

Progress is the state document ``progress:<run id>`` in the layer's store: a job body
writes it (a dict such as ``{"done": 40, "total": 200}``) and it is returned as is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from celery.result import AsyncResult

from conventions.observability.progress import PROGRESS_STATE
from conventions.task import ConventionTask

#: Celery's task states -> the states a web page shows
STATES = {
    "PENDING": "queued",  # also an unknown id: Celery cannot tell them apart
    "RECEIVED": "queued",
    "STARTED": "running",
    PROGRESS_STATE: "running",  # ctx.progress() reports it into the result backend
    "RETRY": "retrying",
    "SUCCESS": "succeeded",
    "FAILURE": "failed",
    "REVOKED": "failed",
    "REJECTED": "failed",
}


def progress_name(run_id: str) -> str:
    """The store's state document that holds a run's progress."""
    return f"progress:{run_id}"


@dataclass(frozen=True)
class RunState:
    """What a poll returns: JSON-ready with :meth:`as_dict`."""

    run_id: str
    #: queued, running, retrying, succeeded or failed
    state: str
    #: the job's own progress document, or None before it writes one
    progress: dict[str, Any] | None = None
    #: the job's return value, once succeeded
    result: Any = None
    #: the exception's type name, once failed (never its message: it may hold data)
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "failed")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def trigger(task: ConventionTask, **payload: Any) -> str:
    """Publish ``task`` with ``payload`` and return the run id to poll."""
    return str(task.delay(**payload).id)


def run_state(app: Any, run_id: str) -> RunState:
    """The state of run ``run_id``: one result-backend read, one store read (and a read
    of each again when the job started between the two: see the module)."""
    found = AsyncResult(run_id, app=app)
    state = _shown(found)
    progress = app.store.get_state(progress_name(run_id))
    if state == "queued" and progress is not None:
        found = AsyncResult(run_id, app=app)
        state = _shown(found)
        if state in ("succeeded", "failed"):  # its last progress came before its outcome
            progress = app.store.get_state(progress_name(run_id))
    if state == "succeeded":
        return RunState(run_id, state, progress, result=found.result)
    if state == "failed":
        error = found.result
        name = type(error).__name__ if isinstance(error, BaseException) else str(error)
        return RunState(run_id, state, progress, error=name)
    return RunState(run_id, state, progress)


def _shown(found: AsyncResult) -> str:
    """The state a web page shows for Celery's state of ``found`` (one read)."""
    return STATES.get(found.state, str(found.state).lower())
