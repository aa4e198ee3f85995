"""Runs: the run history (``conventions.store.runs``) for an operator.

The list shows the runs running now (with their progress), the stuck ones (running past
their time limit, or with a lapsed ledger lease) and the recent runs, filtered by task,
state, key (either form: ``billing.charge_invoice:charge:inv_4004`` or
``charge:inv_4004``), correlation id, queue and time, paged, counted and sorted, with
each run's last error; the page refreshes itself (``console.js``). A run's page shows its
fields, each attempt (worker, start, end, outcome, scrubbed error), its log lines (for
jobs that keep them) and its children: the runs its body published (causation
``job:<its id>``). An admin re-runs an ended job from it (``conventions.ops.rerun``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from conventions.console import views
from conventions.console.context import (
    Refused,
    base_path,
    console_of,
    first,
    page_number,
    render,
    require,
    submitted,
)
from conventions.observability import progress, shown
from conventions.observability import runs as runlib
from conventions.ops import rerun as rerunlib
from conventions.store import key_forms
from conventions.store.runs import STATES, Run
from conventions.task import ConventionTask

#: the most runs a list shows
LIMIT = 200
#: the most running runs looked at for progress and stuck (each is one more read)
RUNNING = 100
#: the runs a page of the list shows, and the most the list reads before it sorts
PER_PAGE = 50
SCAN = 1000
#: the list's orders: name -> (a run's sort key, largest first)
SORTS: dict[str, tuple[Callable[[Run], Any], bool]] = {
    "newest": (lambda run: run.created_at, True),
    "oldest": (lambda run: run.created_at, False),
    "ended": (lambda run: run.ended_at or run.updated_at, True),
    "task": (lambda run: run.task, False),
    "attempts": (lambda run: len(run.attempts), True),
}


@dataclass(frozen=True)
class Filters:
    task: str = ""
    state: str = ""
    key: str = ""
    correlation: str = ""
    queue: str = ""
    since: str = ""
    #: a run's id, its key (either form) or a part of its key (a payload id: ``inv_4004``)
    q: str = ""
    sort: str = "newest"
    page: str = "1"


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
    if filters.sort not in SORTS:
        raise Refused(400, f"no sort {filters.sort!r} ({', '.join(SORTS)})")
    found = key_forms.list_runs(  # the key in either form
        app.store, key_forms.job_names(app), filters.key or None,
        task=filters.task or None, state=filters.state or None,
        correlation_id=filters.correlation or None, queue=filters.queue or None,
        since=since, limit=SCAN,
    )  # fmt: skip
    order, backwards = SORTS[filters.sort]
    matching = [run for run in found if not filters.q or found_by(run, filters.q)]
    return sorted(matching, key=order, reverse=backwards)


def found_by(run: Run, text: str) -> bool:
    """Does the search ``text`` name ``run``: its id, its correlation id, its key in
    either form, or a part of its key between colons (a payload id: the key of
    ``charge:{invoice_id}`` holds it)?"""
    if text in (run.id, run.correlation_id):
        return True
    key = run.key or ""
    return bool(key) and (key_forms.same_key(run.task, key, text) or text in key.split(":"))


def _running(app: Any) -> tuple[list[tuple[Run, dict[str, Any] | None]], list[tuple[Run, str]]]:
    store = app.store
    running = store.list_runs(state="running", limit=RUNNING)
    with_progress = [(run, progress.read_progress(store, run.id)) for run in running]
    stuck = runlib.stuck(store, running, lambda task: time_limit(app, task))
    return with_progress, stuck


def _page(app: Any, filters: Filters, number: int) -> dict[str, Any]:
    """The page's parts. The list as it opens (no filter, newest first) reads only the
    runs up to its page and counts them all with one call."""
    running, stuck = _running(app)
    window = slice((number - 1) * PER_PAGE, number * PER_PAGE)
    plain = not any(v for k, v in asdict(filters).items() if k not in ("sort", "page"))
    if plain and filters.sort == "newest":
        page, capped = app.store.list_runs(limit=number * PER_PAGE)[window], False
        count = int(app.store.count_runs())
    else:
        matching = _recent(app, filters)
        page, count, capped = matching[window], len(matching), len(matching) >= SCAN
    return {
        "recent": [shown.run(app, run) for run in page], "running": running, "stuck": stuck,
        "count": count, "capped": capped, "pages": max(1, -(-count // PER_PAGE)),
    }  # fmt: skip


def message(run: Run) -> str:
    """The run's last error, first line (what its list shows)."""
    errors = [a.error for a in run.attempts if a.error]
    return errors[-1].strip().splitlines()[0] if errors and errors[-1].strip() else ""


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
    filters = Filters(
        *(q.get(name, default).strip() for name, default in asdict(Filters()).items())
    )
    number = page_number(filters.page)
    found = await run_in_threadpool(_page, app, filters, number)
    tasks = sorted(name for name, t in app.tasks.items() if isinstance(t, ConventionTask))
    context = {
        **found,
        "filters": filters,
        "filtered": any(v for k, v in asdict(filters).items() if k not in ("sort", "page")),
        "page": number,
        "sorts": list(SORTS),
        "link": lambda **change: _link(filters, change),
        "message": message,
        "scan": SCAN,
        "tasks": tasks,
        "states": STATES,
        "when": views.when,
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
    context = {**found, "when": views.when, "rerunnable": found["run"].state in rerunlib.ENDED}
    return render(request, who, "run.html", context)


def _link(filters: Filters, change: dict[str, Any]) -> str:
    values = {**asdict(filters), **{k: str(v) for k, v in change.items()}}
    return "?" + urlencode({k: v for k, v in values.items() if v and (k, v) != ("page", "1")})


def _rerun(app: Any, task_id: str, reason: str, actor: str, force: bool) -> str:
    try:
        result = rerunlib.rerun(app, task_id, reason=reason, actor=actor, force=force)
    except rerunlib.RerunRefused as exc:
        raise Refused(409, str(exc)) from exc
    except LookupError as exc:
        raise Refused(404, str(exc)) from exc
    except ValueError as exc:
        raise Refused(400, str(exc)) from exc
    if getattr(result, "deduplicated", False):
        raise Refused(409, f"not published: its key is still held by job {result.id}")
    return str(result.id)


async def rerun(request: Request) -> Response:
    """Run an ended job again (an admin, with a reason); answers with a redirect to the
    new job's run (a reload publishes nothing)."""
    who, form = await submitted(request, "rerun")
    task_id, reason = first(form, "task_id"), first(form, "reason")
    force = first(form, "force") in ("1", "on", "yes", "true")
    if not task_id or not reason:
        raise Refused(400, "a re-run needs the run's id and a reason (kept in the audit)")
    app = console_of(request).app
    new_id = await run_in_threadpool(_rerun, app, task_id, reason, who.actor, force)
    return RedirectResponse(f"{base_path(request)}/runs/{quote(new_id)}", status_code=303)


ROUTES = [
    Route("/runs", index, name="runs"),
    Route("/runs.json", running, name="runs_json"),
    Route("/runs/rerun", rerun, methods=["POST"], name="rerun"),
    Route("/runs/{task_id}", detail, name="run"),
]
