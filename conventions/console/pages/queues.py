"""Queues: waiting, oldest age against its SLO, delayed and next due, in flight, in
inboxes, consumers and those alive, paused or not; the page refreshes itself from
``/queues.json``. An operator pauses and resumes a queue fleet-wide
(``conventions.console.pauses``).

The same reading as ``conventions queues`` (``conventions.observability.queues`` through
``conventions.ops.transport_view``): a few broker commands per read, and one broadcast
asking the workers what they consume.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from conventions.console.context import (
    Refused,
    console_of,
    first,
    render,
    require,
    submitted,
)
from conventions.console.rates import Rates
from conventions.observability import queues
from conventions.ops import exporter, pauses, transport_view

#: how long the page waits for the workers' replies about what they consume
CONSUMERS_TIMEOUT = 0.5


def read(app: Any, rates: Rates) -> list[dict[str, Any]]:
    """Every queue's state, with its SLO and whether its oldest job is past it, whether
    it is paused, and its rates in and out since the last reading."""
    try:
        reader = transport_view.broker_reader(app)
    except ValueError as exc:
        raise Refused(503, str(exc)) from exc
    try:
        states = reader.read(queues.consumers(app, timeout=CONSUMERS_TIMEOUT))
        slos = exporter.slos(app, reader.queues)
    finally:
        reader.close()
    held = pauses.QUEUES.get_many(app.store, [state.queue for state in states])
    flow = rates.sample(app)
    out = []
    for state in states:
        row = state.to_dict()
        row["slo"] = slos.get(state.queue)
        row["paused"] = held.get(state.queue)
        row["in_per_s"], row["out_per_s"] = flow.get(state.queue, (None, None))
        age, slo = row["oldest_age"], row["slo"]
        row["late"] = bool(age is not None and slo and age > slo)
        out.append(row)
    return out


async def index(request: Request) -> Response:
    who = await require(request, "view")
    console = console_of(request)
    found = await run_in_threadpool(read, console.app, console.rates)
    context = {"rows": found, "refresh": f"{console_of(request).refresh_seconds:g}"}
    return render(request, who, "queues.html", context)


async def as_json(request: Request) -> Response:
    await require(request, "view")
    console = console_of(request)
    found = await run_in_threadpool(read, console.app, console.rates)
    return JSONResponse({"queues": found}, headers={"cache-control": "no-store"})


def _known(app: Any, queue: str) -> str:
    if queue not in queues.queue_names(app):
        raise Refused(404, f"no queue {queue!r} in this app's configuration")
    return queue


async def pause(request: Request) -> Response:
    who, form = await submitted(request, "pause")
    app = console_of(request).app
    queue, reason = _known(app, first(form, "queue")), first(form, "reason")
    if not reason:
        raise Refused(400, "a pause needs a reason (it is kept in the audit trail)")
    done = await run_in_threadpool(lambda: pauses.pause(app, queue, actor=who.actor, reason=reason))
    return render(request, who, "paused.html", {"queue": queue, "paused": done, "resumed": None})


async def resume(request: Request) -> Response:
    who, form = await submitted(request, "pause")
    app = console_of(request).app
    queue = _known(app, first(form, "queue"))
    workers = await run_in_threadpool(lambda: pauses.resume(app, queue, actor=who.actor))
    return render(request, who, "paused.html", {"queue": queue, "paused": None, "resumed": workers})


ROUTES = [
    Route("/queues/pause", pause, methods=["POST"], name="pause"),
    Route("/queues/resume", resume, methods=["POST"], name="resume"),
    Route("/queues", index, name="queues"),
    Route("/queues.json", as_json, name="queues_json"),
]
