"""Dead letters: the list with filters, one record, and replays (one or a selection).

A replay is ``conventions.ops.replay.replay`` with the authorizer's actor and a reason
the form requires: the same payload, key and correlation id, a ``replayed`` audit
event. An operator replays; a task declared ``replayable=False`` (or a record replayed
already) needs ``force``, which only an admin may give, and the page says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conventions.console import views
from conventions.console.context import Refused, console_of, first, render, require, submitted
from conventions.observability import shown
from conventions.ops import replay as replaylib
from conventions.store import key_forms
from conventions.store.records import Category, DeadLetter
from conventions.task import ConventionTask

#: the most records a list shows
LIMIT = 200
NOT_REPLAYABLE = (
    "{task} is declared replayable=False: its effect (money moved, say) must not happen "
    "twice by accident. Check that it did not happen; then an admin may replay it with "
    "force."
)


@dataclass(frozen=True)
class Filters:
    task: str = ""
    category: str = ""
    since: str = ""
    key: str = ""


def replayable(app: Any, task: str) -> bool | None:
    """Is ``task`` replayable (None: not a convention task of this app)?"""
    found = app.tasks.get(task)
    return bool(found.replayable) if isinstance(found, ConventionTask) else None


def _records(app: Any, filters: Filters) -> list[DeadLetter]:
    try:
        since = views.parse_since(filters.since)
    except ValueError as exc:
        raise Refused(400, f"since {filters.since!r}: {exc} (try 30m, 2h, 7d or a date)") from exc
    category = None
    if filters.category:
        try:
            category = Category(filters.category)
        except ValueError as exc:
            raise Refused(400, f"no dead-letter category {filters.category!r}") from exc
    store = app.store
    limit = max(store.count_dead_letters(), 1) if filters.key else LIMIT
    records = store.list_dead_letters(
        task=filters.task or None, category=category, since=since, limit=limit
    )
    if filters.key:
        records = [r for r in records if key_forms.same_key(r.task, r.idempotency_key, filters.key)]
    return list(records[:LIMIT])


async def index(request: Request) -> Response:
    who = await require(request, "view")
    app = console_of(request).app
    q = request.query_params
    filters = Filters(*(q.get(name, "").strip() for name in ("task", "category", "since", "key")))
    records = await run_in_threadpool(_records, app, filters)
    tasks = sorted(name for name, t in app.tasks.items() if isinstance(t, ConventionTask))
    rows = [(shown.dead_letter(app, r), replayable(app, r.task)) for r in records]
    context = {
        "rows": rows,
        "filters": filters,
        "tasks": tasks,
        "categories": [str(c) for c in Category],
        "when": views.when,
        "limit": LIMIT,
    }
    return render(request, who, "dead_letters.html", context)


async def detail(request: Request) -> Response:
    who = await require(request, "view")
    app = console_of(request).app
    record_id = request.path_params["record_id"]
    found = await run_in_threadpool(app.store.get_dead_letter, record_id)
    if found is None:
        raise Refused(404, f"no dead letter with id {record_id!r}")
    record = shown.dead_letter(app, found)  # the key, payload and texts as shown anywhere
    can = replayable(app, record.task)
    context = {
        "record": record,
        "replayable": can,
        "why": NOT_REPLAYABLE.format(task=record.task) if can is False else "",
        "payload": views.pretty(record.payload),
        "headers": views.pretty(record.headers),
        "message": views.scrubbed(record.message),
        "traceback": views.scrubbed(record.traceback),
        "when": views.when,
    }
    return render(request, who, "dead_letter.html", context)


def _replay_all(
    app: Any, ids: list[str], reason: str, actor: str, force: bool
) -> list[dict[str, Any]]:
    out = []
    for record_id in ids:
        try:
            result = replaylib.replay(app, record_id, reason=reason, actor=actor, force=force)
        except (PermissionError, LookupError, ValueError) as exc:
            out.append({"id": record_id, "status": "refused", "detail": str(exc)})
            continue
        if getattr(result, "deduplicated", False):
            detail = f"its key is still held by job {result.id}: nothing was published"
            out.append({"id": record_id, "status": "deduplicated", "detail": detail})
        else:
            out.append({"id": record_id, "status": "replayed", "task_id": str(result.id)})
    return out


async def replay(request: Request) -> Response:
    who, form = await submitted(request, "replay")
    ids = [i.strip() for i in form.get("id", []) if i.strip()]
    reason = first(form, "reason")
    force = first(form, "force") in ("1", "on", "yes", "true")
    if not ids:
        raise Refused(400, "select at least one dead letter to replay")
    if not reason:
        raise Refused(400, "a replay needs a reason (it is kept in the audit trail)")
    if force and not who.may("force-replay"):
        raise Refused(403, f"{who.actor} ({who.role}) may not replay with force: admins only")
    app = console_of(request).app
    outcomes = await run_in_threadpool(_replay_all, app, ids, reason, who.actor, force)
    status = 200 if all(o["status"] == "replayed" for o in outcomes) else 409
    return render(request, who, "replayed.html", {"outcomes": outcomes}, status=status)


ROUTES = [
    Route("/dead-letters", index, name="dead_letters"),
    Route("/dead-letters/replay", replay, methods=["POST"], name="replay"),
    Route("/dead-letters/{record_id}", detail, name="dead_letter"),
]
