"""Queues: waiting, oldest age against its SLO, delayed and next due, in flight, in
inboxes, consumers and those alive, paused or not; the page refreshes itself from
``/queues.json``. An operator pauses and resumes a queue fleet-wide
(``conventions.console.pauses``).

The same reading as ``conventions queues`` (``conventions.observability.queues`` through
``conventions.ops.transport_view``): a few broker commands per read, and one broadcast
asking the workers what they consume.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from conventions.console import charts
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
from conventions.ops import exporter, pauses, sampler, transport_view
from conventions.store import series
from conventions.worker.queue_pauses import WATCH_EVERY

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
    sampler.sample(app, ages={state.queue: state.oldest_age for state in states})
    return out


def drawn(app: Any, name: str, order: list[str]) -> list[dict[str, Any]]:
    """The charts of the range ``name`` (``hour``, ``day``) as SVG, with their totals."""
    if name not in charts.RANGES:
        raise Refused(400, f"no chart range {name!r} (hour or day)")
    until = datetime.now(UTC)
    length, width = charts.RANGES[name]
    samples = series.read(app.store, until - length - width, until)  # a bin more: its totals
    queues_seen = order + sorted({q for _, row in samples for q in row} - set(order))
    return [
        {"title": c.title, "svg": charts.svg(c, queues_seen), "field": c.field,
         "total": c.total, "peak": c.peak, "unit": c.unit}
        for c in charts.charts(samples, until, name)
    ]  # fmt: skip


async def index(request: Request) -> Response:
    who = await require(request, "view")
    console = console_of(request)
    found = await run_in_threadpool(read, console.app, console.rates)
    span = request.query_params.get("range", "hour")
    order = queues.queue_names(console.app)
    drawings = await run_in_threadpool(drawn, console.app, span, order)
    context = {
        "rows": found,
        "refresh": f"{console_of(request).refresh_seconds:g}",
        "charts": drawings,
        "range": span,
        "ranges": list(charts.RANGES),
        "order": order,
    }
    return render(request, who, "queues.html", context)


async def chart_part(request: Request) -> Response:
    """The charts alone (an HTML fragment), for the page's refresh of them."""
    who = await require(request, "view")
    console = console_of(request)
    span = request.query_params.get("range", "hour")
    order = queues.queue_names(console.app)
    drawings = await run_in_threadpool(drawn, console.app, span, order)
    context = {"charts": drawings, "range": span, "order": order}
    return render(request, who, "charts.html", context)


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
    context = {"queue": queue, "paused": done, "resumed": None, "watch_every": f"{WATCH_EVERY:g}"}
    return render(request, who, "paused.html", context)


async def resume(request: Request) -> Response:
    who, form = await submitted(request, "pause")
    app = console_of(request).app
    queue = _known(app, first(form, "queue"))
    done = await run_in_threadpool(lambda: pauses.resume(app, queue, actor=who.actor))
    context = {"queue": queue, "paused": None, "resumed": done, "watch_every": f"{WATCH_EVERY:g}"}
    return render(request, who, "paused.html", context)


ROUTES = [
    Route("/queues/pause", pause, methods=["POST"], name="pause"),
    Route("/queues/resume", resume, methods=["POST"], name="resume"),
    Route("/queues", index, name="queues"),
    Route("/queues.json", as_json, name="queues_json"),
    Route("/queues/charts", chart_part, name="queue_charts"),
]
