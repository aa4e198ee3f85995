"""Trace: every job and event of one correlation id, as a tree (``conventions trace``)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conventions.console import views
from conventions.console.context import console_of, render, require
from conventions.observability import shown, trace


async def index(request: Request) -> Response:
    who = await require(request, "view")
    correlation = request.query_params.get("correlation", "").strip()
    roots: list[trace.Job] = []
    if correlation:
        app = console_of(request).app
        events = await run_in_threadpool(app.store.audit_for, correlation)
        roots = trace.build_trace(shown.audit_events(app, events))
    context = {"correlation": correlation, "roots": roots, "when": views.when}
    status = 404 if correlation and not roots else 200
    return render(request, who, "trace.html", context, status=status)


ROUTES = [Route("/trace", index, name="trace")]
