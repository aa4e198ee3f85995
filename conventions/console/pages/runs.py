"""Runs: the run history (``conventions.store.runs``) for an operator.

The list shows the runs running now (with their progress), the stuck ones (running past
their time limit, or with a lapsed ledger lease) and the recent runs, filtered by task,
state, key, correlation id, queue and time. A run's page shows its fields, each attempt
(worker, start, end, outcome, scrubbed error), its log lines (for jobs that keep them)
and its children: the runs its body published (causation ``job:<its id>``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from conventions.console import views
from conventions.console.context import Refused, console_of, render, require
from conventions.observability import progress, shown
from conventions.observability import runs as runlib
from conventions.store import key_forms
from conventions.store.runs import STATES, Run
from conventions.task import ConventionTask

#: the most runs a list shows
LIMIT = 200
#: the most running runs looked at for progress and stuck (each is one more read)
RUNNING = 100


@dataclass(frozen=True)
class Filters:
    task: str = ""
    state: str = ""
    key: str = ""
    correlation: str = ""
    queue: str = ""
    since: str = ""


def time_limit(app: Any, task: str) -> float | None:
    """The seconds a run of ``task`` may take (its hard or soft limit, else the default)."""
    found = app.tasks.get(task)
    limit = getattr(found, "time_limit", None) or getattr(found, "soft_time_limit", None)
    if limit:
        return float(limit)
    default = getattr(getattr(app, "conventions_settings", None), "default_time_limit", None)
    return float(default) if default else None


def _recent(app: Any, filters: Filters) -> list[Run]:
    try:
        since = views.parse_since(filters.since)
    except ValueError as exc:
        raise Refused(400, f"since {filters.since!r}: {exc} (try 30m, 2h, 7d or a date)") from exc
    if filters.state and filters.state not in STATES:
        raise Refused(400, f"no run state {filters.state!r}")
    return key_forms.list_runs(  # the key in either form
        app.store, key_forms.job_names(app), filters.key or None,
        task=filters.task or None, state=filters.state or None,
        correlation_id=filters.correlation or None, queue=filters.queue or None,
        since=since, limit=LIMIT,
    )  # fmt: skip


def _running(app: Any) -> tuple[list[tuple[Run, dict[str, Any] | None]], list[tuple[Run, str]]]:
    store = app.store
    running = store.list_runs(state="running", limit=RUNNING)
    with_progress = [(run, progress.read_progress(store, run.id)) for run in running]
    stuck = runlib.stuck(store, running, lambda task: time_limit(app, task))
    return with_progress, stuck


def _page(app: Any, filters: Filters) -> dict[str, Any]:
    running, stuck = _running(app)
    recent = [shown.run(app, run) for run in _recent(app, filters)]
    return {"recent": recent, "running": running, "stuck": stuck}


def running_json(run: Run, done: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": run.id, "task": run.task, "worker": run.worker,
        "started_at": views.when(run.attempts[-1].started_at if run.attempts else None),
        "progress": done,
    }  # fmt: skip


async def index(request: Request) -> Response:
    who = await require(request, "view")
    console = console_of(request)
    app = console.app
    q = request.query_params
    filters = Filters(*(q.get(name, "").strip() for name in asdict(Filters())))
    found = await run_in_threadpool(_page, app, filters)
    tasks = sorted(name for name, t in app.tasks.items() if isinstance(t, ConventionTask))
    context = {
        **found,
        "filters": filters,
        "filtered": any(asdict(filters).values()),
        "tasks": tasks,
        "states": STATES,
        "when": views.when,
        "limit": LIMIT,
        "refresh": console.refresh_seconds,
    }
    return render(request, who, "runs.html", context)


async def running(request: Request) -> Response:
    """The running runs with their progress, as JSON (the live refresh of the list)."""
    await require(request, "view")
    app = console_of(request).app
    found, stuck = await run_in_threadpool(_running, app)
    return JSONResponse(
        {
            "running": [running_json(run, done) for run, done in found],
            "stuck": [{"id": run.id, "why": why} for run, why in stuck],
        }
    )


def _detail(app: Any, task_id: str) -> dict[str, Any] | None:
    store = app.store
    run = store.get_run(task_id)
    if run is None:
        return None
    children: list[Run] = []
    if run.correlation_id:
        family = store.list_runs(correlation_id=run.correlation_id, limit=LIMIT)
        children = [other for other in family if other.causation_id == f"job:{run.id}"]
    stuck = runlib.stuck(store, [run], lambda task: time_limit(app, task)) if run.live else []
    run = shown.run(app, run)  # its key, errors and logs as shown anywhere
    return {
        "run": run,
        "children": children,
        "progress": progress.read_progress(store, run.id),
        "stuck": stuck[0][1] if stuck else "",
        "errors": [a.error for a in run.attempts],
        "logs": list(run.logs),
    }


async def detail(request: Request) -> Response:
    who = await require(request, "view")
    app = console_of(request).app
    task_id = request.path_params["task_id"]
    found = await run_in_threadpool(_detail, app, task_id)
    if found is None:
        raise Refused(404, f"no run {task_id!r} (never recorded, or past retention)")
    return render(request, who, "run.html", {**found, "when": views.when})


ROUTES = [
    Route("/runs", index, name="runs"),
    Route("/runs.json", running, name="runs_json"),
    Route("/runs/{task_id}", detail, name="run"),
]
