"""Batches: the newest batches with their members done, failed and pending, and one
batch's page: its counters, its callbacks (their state and their run), its nested
batches and the members that are not done (failed first, with their dead letters)."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conventions.console import views
from conventions.console.context import console_of, render, require
from conventions.observability import shown
from conventions.store import batches as b

#: batches the list shows
LIMIT = 100
#: members of one batch the page lists (failed first, then pending)
MEMBERS_SHOWN = 200


async def index(request: Request) -> Response:
    who = await require(request, "view")
    store = console_of(request).app.store
    listed = await run_in_threadpool(store.list_batches, LIMIT)
    return render(request, who, "batches.html", {"batches": listed, "when": views.when})


def _detail(app: Any, batch_id: str) -> dict[str, Any] | None:
    status = app.store.get_batch(batch_id)
    if status is None:
        return None
    order = {b.FAILED: 0, b.PENDING: 1}
    open_members = sorted(
        ((name, *entry) for name, entry in status.members.items() if entry[0] in order),
        key=lambda row: (order[row[1]], row[0]),
    )
    # a member's name is its key: shown as every surface shows keys (``shown``)
    listed = [(shown.any_key(app, name), *rest) for name, *rest in open_members[:MEMBERS_SHOWN]]
    callbacks = [
        {
            "which": which, "task": status.callbacks[which]["task"], "state": state,
            "task_id": status.callback_task_id(which),
            "run": app.store.get_run(status.callback_task_id(which)),
        }
        for which, state in status.callback_states.items()
    ]  # fmt: skip
    nested = [name[len(b.NESTED) :] for name in status.members if name.startswith(b.NESTED)]
    return {
        "batch": status, "callbacks": callbacks, "nested": nested,
        "open_members": listed, "open_count": len(open_members),
    }  # fmt: skip


async def detail(request: Request) -> Response:
    who = await require(request, "view")
    batch_id = request.path_params["batch_id"]
    found = await run_in_threadpool(_detail, console_of(request).app, batch_id)
    if found is None:
        context = {"batch_id": batch_id}
        return render(request, who, "batch_missing.html", context, status=404)
    return render(request, who, "batch.html", {**found, "when": views.when})


ROUTES = [
    Route("/batches", index, name="batches"),
    Route("/batches/{batch_id:path}", detail, name="batch"),
]
