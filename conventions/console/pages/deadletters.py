"""Dead letters: the list with filters, one record, and replays (one or a selection).

A replay is ``conventions.ops.replay.replay`` with the authorizer's actor and a reason
the form requires: the same payload, key and correlation id, a ``replayed`` audit
event. An operator replays; a task declared ``replayable=False`` (or a record replayed
already) needs ``force``, which only an admin may give, and the page says why. A
replay's POST answers with a redirect to its outcome (POST/redirect/GET: a reload
replays nothing); the record's page then says who replayed it, why, and links the new
job, and offers no second replay but an admin's forced one.

The list pages through every record of its filters (the newest ``SCAN`` read), counts
them, sorts them, and finds a record by its id, its job's id, a payload value or its
key in either form (``billing.charge_invoice:charge:inv_4004`` or ``charge:inv_4004``).
An operator discards a selection with a reason (``conventions.ops.discard``: each
deletion audited).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
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
from conventions.observability import shown
from conventions.ops import discard as discardlib
from conventions.ops import replay as replaylib
from conventions.store import key_forms
from conventions.store.records import AuditEvent, Category, DeadLetter
from conventions.task import ConventionTask
from conventions.tracing import headers

#: the records a page of the list shows
PER_PAGE = 50
#: the most records a filtered or sorted list reads (newest first) before it filters,
#: sorts and counts them
SCAN = 1000
#: the list's orders: name -> (record field, newest/largest first)
SORTS = {
    "newest": ("last_failed_at", True),
    "oldest": ("last_failed_at", False),
    "task": ("task", False),
    "attempts": ("attempts", True),
}
#: the state documents holding a replay's outcome for the page its POST redirects to
OUTCOMES = "console:replays:"
OUTCOMES_KEEP = 3600.0
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
    #: a record's id, its job's id, a payload value (``inv_4004``) or a key
    q: str = ""
    sort: str = "newest"
    page: str = "1"


def replayable(app: Any, task: str) -> bool | None:
    """Is ``task`` replayable (None: not a convention task of this app)?"""
    found = app.tasks.get(task)
    return bool(found.replayable) if isinstance(found, ConventionTask) else None


def found_by(record: DeadLetter, text: str) -> bool:
    """Does the search ``text`` name ``record``: its id, its job's id, its key (either
    form) or one of its payload's values?"""
    if text in (record.id, record.task_id) or key_forms.same_key(
        record.task, record.idempotency_key, text
    ):
        return True
    return any(str(value) == text for value in record.payload.values())


def _records(app: Any, filters: Filters, number: int) -> tuple[list[DeadLetter], int, bool]:
    """Page ``number`` of the records of the filters, sorted; how many match; and whether
    the scan stopped at its cap. The list as it opens (no filter, newest first) reads
    only the records up to its page and counts them all with one call."""
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
    if filters.sort not in SORTS:
        raise Refused(400, f"no sort {filters.sort!r} ({', '.join(SORTS)})")
    window = slice((number - 1) * PER_PAGE, number * PER_PAGE)
    plain = not any((filters.task, category, since, filters.key, filters.q))
    if plain and filters.sort == "newest":
        newest = app.store.list_dead_letters(limit=number * PER_PAGE)
        return newest[window], app.store.count_dead_letters(), False
    records = app.store.list_dead_letters(
        task=filters.task or None, category=category, since=since, limit=SCAN
    )
    capped = len(records) >= SCAN
    if filters.key:
        records = [r for r in records if key_forms.same_key(r.task, r.idempotency_key, filters.key)]
    if filters.q:
        records = [r for r in records if found_by(r, filters.q)]
    field, backwards = SORTS[filters.sort]
    ordered = sorted(records, key=lambda r: getattr(r, field), reverse=backwards)
    return ordered[window], len(ordered), capped


async def index(request: Request) -> Response:
    who = await require(request, "view")
    app = console_of(request).app
    q = request.query_params
    filters = Filters(
        *(q.get(name, default).strip() for name, default in asdict(Filters()).items())
    )
    number = page_number(filters.page)
    shown_now, count, capped = await run_in_threadpool(_records, app, filters, number)
    pages = max(1, -(-count // PER_PAGE))
    tasks = sorted(name for name, t in app.tasks.items() if isinstance(t, ConventionTask))
    seen = [shown.dead_letter(app, r) for r in shown_now]
    rows = [
        (r, replayable(app, r.task), views.cause(r.exc_type, r.message, r.traceback)) for r in seen
    ]
    done = {name: q.get(name, "") for name in ("discarded", "refused") if q.get(name, "").isdigit()}
    context = {
        "rows": rows,
        "filters": filters,
        "filtered": any(getattr(filters, n) for n in ("task", "category", "since", "key", "q")),
        "tasks": tasks,
        "categories": [str(c) for c in Category],
        "when": views.when,
        "count": count,
        "capped": capped,
        "scan": SCAN,
        "page": number,
        "pages": pages,
        "sorts": list(SORTS),
        "link": lambda **change: _link(filters, change),
        "done": done,
    }
    return render(request, who, "dead_letters.html", context)


def _link(filters: Filters, change: dict[str, Any]) -> str:
    values = {**asdict(filters), **{k: str(v) for k, v in change.items()}}
    return "?" + urlencode({k: v for k, v in values.items() if v and (k, v) != ("page", "1")})


def replays_of(app: Any, record: DeadLetter) -> list[AuditEvent]:
    """The ``replayed`` events of ``record``: who, why, when, and the new job."""
    if not record.correlation_id:
        return []
    events = app.store.audit_for(record.correlation_id)
    return shown.audit_events(
        app,
        [
            e
            for e in events
            if e.event == "replayed" and e.detail.get("dead_letter_id") == record.id
        ],
    )


def _detail(app: Any, record_id: str) -> tuple[DeadLetter, list[AuditEvent]] | None:
    found = app.store.get_dead_letter(record_id)
    return None if found is None else (found, replays_of(app, found))


async def detail(request: Request) -> Response:
    who = await require(request, "view")
    app = console_of(request).app
    record_id = request.path_params["record_id"]
    found = await run_in_threadpool(_detail, app, record_id)
    if found is None:
        raise Refused(404, f"no dead letter with id {record_id!r}")
    record = shown.dead_letter(app, found[0])  # the key, payload and texts as shown anywhere
    can = replayable(app, record.task)
    context = {
        "record": record,
        "replayable": can,
        "why": NOT_REPLAYABLE.format(task=record.task) if can is False else "",
        "payload": views.pretty(record.payload),
        "headers": views.pretty(record.headers),
        "message": views.scrubbed(record.message),
        "cause": views.scrubbed(views.cause(record.exc_type, record.message, record.traceback)),
        "frames": views.frames(views.scrubbed(record.traceback)),
        "replays": found[1],
        "trace_id": headers.trace_id(found[0].headers),
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
    name = uuid.uuid4().hex
    kept = {"actor": who.actor, "reason": reason, "outcomes": outcomes}
    await run_in_threadpool(app.store.put_state, f"{OUTCOMES}{name}", kept, OUTCOMES_KEEP)
    return RedirectResponse(f"{base_path(request)}/dead-letters/replays/{name}", status_code=303)


async def replayed(request: Request) -> Response:
    """A replay's outcome (the page a replay's POST redirects to: a reload shows it
    again and replays nothing)."""
    who = await require(request, "view")
    name = request.path_params["outcome"]
    store = console_of(request).app.store
    kept = await run_in_threadpool(store.get_state, f"{OUTCOMES}{name}") if name.isalnum() else None
    if kept is None:
        raise Refused(404, "no such replay outcome (they are kept for an hour)")
    outcomes = kept.get("outcomes", [])
    status = 200 if all(o["status"] == "replayed" for o in outcomes) else 409
    context = {"outcomes": outcomes, "actor": kept.get("actor"), "reason": kept.get("reason")}
    return render(request, who, "replayed.html", context, status=status)


def _discard_all(app: Any, ids: list[str], reason: str, actor: str) -> int:
    return sum(discardlib.discard(app, i, reason=reason, actor=actor) for i in ids)


async def discard(request: Request) -> Response:
    """Delete the selected dead letters, each audited with the actor and the reason."""
    who, form = await submitted(request, "discard")
    ids = [i.strip() for i in form.get("id", []) if i.strip()]
    reason = first(form, "reason")
    if not ids:
        raise Refused(400, "select at least one dead letter to discard")
    if not reason:
        raise Refused(400, "discarding needs a reason (it is kept in the audit trail)")
    app = console_of(request).app
    gone = await run_in_threadpool(_discard_all, app, ids, reason, who.actor)
    query = urlencode({"discarded": gone, "refused": len(ids) - gone})
    return RedirectResponse(f"{base_path(request)}/dead-letters?{query}", status_code=303)


ROUTES = [
    Route("/dead-letters", index, name="dead_letters"),
    Route("/dead-letters/replay", replay, methods=["POST"], name="replay"),
    Route("/dead-letters/discard", discard, methods=["POST"], name="discard"),
    Route("/dead-letters/replays/{outcome}", replayed, name="replayed"),
    Route("/dead-letters/{record_id}", detail, name="dead_letter"),
]
