"""Batches: the newest batches with their members done, failed and pending, and one
batch's page: its counters, its callbacks (their state and their run), its nested
batches and the members that are not done (failed first, with their dead letters), read
as ``conventions batches show`` reads them (``conventions.ops.batch_view``).

An operator ends a pending member by hand there, with a reason
(``conventions.ops.batch_ends``, as ``conventions batches end``): audited with the
authorizer's actor, the callbacks it makes due published. The POST answers with a
redirect to the batch's page (POST/redirect/GET: a reload ends nothing twice).
"""

from __future__ import annotations

from urllib.parse import quote

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
    render,
    require,
    submitted,
)
from conventions.ops import batch_ends, batch_view

#: batches the list shows
LIMIT = 100
#: members of one batch the page lists (failed first, then pending)
MEMBERS_SHOWN = batch_view.MEMBERS_SHOWN


async def index(request: Request) -> Response:
    who = await require(request, "view")
    store = console_of(request).app.store
    listed = await run_in_threadpool(store.list_batches, LIMIT)
    return render(request, who, "batches.html", {"batches": listed, "when": views.when})


async def detail(request: Request) -> Response:
    who = await require(request, "view")
    batch_id = request.path_params["batch_id"]
    app = console_of(request).app
    found = await run_in_threadpool(batch_view.detail, app, batch_id, MEMBERS_SHOWN)
    if found is None:
        context = {"batch_id": batch_id}
        return render(request, who, "batch_missing.html", context, status=404)
    context = {
        "batch": found.batch, "callbacks": found.callbacks, "nested": found.nested,
        "open_members": found.open_members, "open_count": found.open_count,
        "outcomes": sorted(batch_ends.OUTCOMES), "when": views.when,
        "ended": request.query_params.get("ended", ""),
    }  # fmt: skip
    return render(request, who, "batch.html", context)


async def end_member(request: Request) -> Response:
    who, form = await submitted(request, "end-member")
    batch_id, member = first(form, "batch_id"), first(form, "member")
    outcome, reason = first(form, "outcome"), first(form, "reason")
    if not reason:
        raise Refused(400, "ending a batch member needs a reason (it is kept in the audit trail)")
    if outcome not in batch_ends.OUTCOMES:
        raise Refused(400, f"outcome must be succeeded or failed, not {outcome[:20]!r}")
    app = console_of(request).app
    try:
        await run_in_threadpool(
            lambda: batch_ends.end_member(
                app, batch_id, member, outcome=outcome, reason=reason, actor=who.actor
            )
        )
    except LookupError as exc:
        raise Refused(404, str(exc)) from exc
    except batch_ends.EndRefused as exc:
        raise Refused(409, str(exc)) from exc
    target = f"{base_path(request)}/batches/{quote(batch_id, safe='')}?ended={quote(member)}"
    return RedirectResponse(target, status_code=303)


ROUTES = [
    Route("/batches", index, name="batches"),
    Route("/batches/end", end_member, methods=["POST"], name="batch_end"),
    Route("/batches/{batch_id:path}", detail, name="batch"),
]
