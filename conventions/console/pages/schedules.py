"""Schedules: the entries, their cadence in words (``daily at 02:00 Europe/Berlin``), the
next run as a time, the last occurrence, last success, watchdog state; a banner when
beat looks down (an occurrence due over ``GRACE`` ago has no sent record: beat records
every send) or when no worker consumes an entry's queue;
send an occurrence now; pause and resume an entry (``conventions.schedules.pauses``: beat
sends nothing of a paused entry; a trigger still sends the occurrence it names).

"Trigger" sends the occurrence the page shows (the latest one due, named on the button
and posted with the form) exactly as beat would (``conventions.schedules.triggers``: an
edited form naming another occurrence, older than the current one and outside the
entry's catch-up window, or still to come, is refused with its reason and audited):
its business key is the occurrence's, so a double click, a second operator or beat
itself sends it once, even when the clock passes the next occurrence between two
clicks. The trigger is audited
(``triggered``) with the authorizer's actor, whether it sent or found it sent.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conventions.console import cadence, views
from conventions.console.context import Refused, console_of, first, render, require, submitted
from conventions.errors import ConfigurationError
from conventions.observability import audit, queues
from conventions.ops import exporter
from conventions.schedules import beat, overlap, pauses, triggers, watchdog
from conventions.schedules import entries as schedules
from conventions.tracing import headers as hdr

#: how late an occurrence may be sent before the page says beat looks down
GRACE = dt.timedelta(minutes=2)
#: how long the page waits for the workers' replies about what they consume
CONSUMERS_TIMEOUT = 0.5


def _watch(app: Any, entry: schedules.Entry, success: dict[str, Any] | None) -> str:
    """The watchdog's view of ``entry``: not watched, waiting for a first look, ok, late."""
    if entry.expect is None:
        return "not watched (no expectation)"
    state = app.store.get_state(f"schedule:watched:{entry.name}")
    if state is None:
        return "not checked yet"
    since = dt.datetime.fromisoformat(str(state["since"]))
    late = watchdog.missed(entry, success, schedules.now(), since)
    return f"late: {', '.join(o.label for o in late)}" if late else "ok"


def rows(app: Any) -> list[dict[str, Any]]:
    """One row per entry, as the page shows it."""
    schedules.use_clock(app.conf)
    current = schedules.now()
    out = []
    for entry in schedules.entries_of(app):
        latest = entry.schedule.latest(current)
        success = overlap.last_success(app.store, entry.name)
        coming = entry.occurrence(entry.schedule.next_after(current))
        out.append(
            {
                "name": entry.name,
                "task": entry.task,
                "schedule": repr(entry.schedule),
                "cadence": cadence.words(entry.schedule),
                "next_at": f"{coming.local:%Y-%m-%d %H:%M} {coming.local.tzname() or ''}",
                "next_in": cadence.until(coming.at, current),
                "unsent": _unsent(app, entry, current),
                "overlap": entry.overlap,
                "next": coming.label,
                "last": entry.occurrence(latest).label if latest else "-",
                "last_at": latest.isoformat() if latest else "",
                "last_success": (success or {}).get("occurrence"),
                "watchdog": _watch(app, entry, success),
                "paused": pauses.ENTRIES.get(app.store, entry.name),
            }
        )
    return out


def _unsent(app: Any, entry: schedules.Entry, current: dt.datetime) -> str:
    """The label of the entry's latest occurrence when it was due over ``GRACE`` ago and
    beat never sent it (its sent record is absent), else ''. A paused entry: ''."""
    latest = entry.schedule.latest(current)
    if latest is None or current - latest < GRACE:
        return ""
    if pauses.ENTRIES.get(app.store, entry.name) is not None:
        return ""
    occurrence = entry.occurrence(latest)
    return "" if app.store.get_state(beat.sent_key(occurrence)) else occurrence.label


def unconsumed(app: Any, entries: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Queue -> the entries sending to it, for each queue no worker consumes (asked by
    broadcast, as the queues page does)."""
    task_queues = exporter.queue_of_tasks(app)
    consumers = queues.consumers(app, timeout=CONSUMERS_TIMEOUT)
    out: dict[str, list[str]] = {}
    for row in entries:
        queue = task_queues.get(row["task"])
        if queue is not None and not consumers.get(queue):
            out.setdefault(queue, []).append(row["name"])
    return out


def _page(app: Any) -> dict[str, Any]:
    found = rows(app)
    return {"rows": found, "unconsumed": unconsumed(app, found) if found else {}}


async def index(request: Request) -> Response:
    who = await require(request, "view")
    found = await run_in_threadpool(_page, console_of(request).app)
    return render(request, who, "schedules.html", {**found, "when": views.when})


def _trigger(app: Any, name: str, at: str, actor: str) -> dict[str, Any]:
    try:
        occurrence, result = triggers.send(app, name, at, actor)
    except triggers.NotOffered as exc:
        raise Refused(400, str(exc)) from exc
    except ConfigurationError as exc:
        raise Refused(404, str(exc)) from exc
    entry = schedules.find(app, name)
    sent = not getattr(result, "deduplicated", False)
    headers = {hdr.CORRELATION: occurrence.correlation_id, hdr.IDEMPOTENCY_KEY: occurrence.key}
    detail = {"actor": actor, "schedule": name, "occurrence": occurrence.label, "sent": sent}
    audit.record(app.store, "triggered", entry.task, str(result.id), headers, detail=detail)
    return {"name": name, "occurrence": occurrence.label, "task_id": str(result.id), "sent": sent}


async def trigger(request: Request) -> Response:
    who, form = await submitted(request, "trigger")
    name = first(form, "name")
    if not name:
        raise Refused(400, "which entry? (the form sends its name)")
    at = first(form, "at")
    outcome = await run_in_threadpool(_trigger, console_of(request).app, name, at, who.actor)
    return render(request, who, "triggered.html", {"outcome": outcome})


def _pause(app: Any, name: str, reason: str, actor: str) -> dict[str, Any]:
    try:
        return pauses.pause(app, name, actor=actor, reason=reason)
    except ConfigurationError as exc:
        raise Refused(404, str(exc)) from exc


def _resume(app: Any, name: str, actor: str) -> bool:
    try:
        return pauses.resume(app, name, actor=actor)
    except ConfigurationError as exc:
        raise Refused(404, str(exc)) from exc


async def pause(request: Request) -> Response:
    who, form = await submitted(request, "pause")
    name, reason = first(form, "name"), first(form, "reason")
    if not name or not reason:
        raise Refused(400, "pausing an entry needs its name and a reason (kept in the audit)")
    await run_in_threadpool(_pause, console_of(request).app, name, reason, who.actor)
    message = f"{name} is paused: beat sends none of its occurrences until it is resumed."
    return render(request, who, "scheduled.html", {"name": name, "message": message})


async def resume(request: Request) -> Response:
    who, form = await submitted(request, "pause")
    name = first(form, "name")
    if not name:
        raise Refused(400, "which entry? (the form sends its name)")
    was = await run_in_threadpool(_resume, console_of(request).app, name, who.actor)
    message = (
        f"{name} is resumed: beat sends it from its next occurrence."
        if was
        else f"{name} was not paused."
    )
    return render(request, who, "scheduled.html", {"name": name, "message": message})


ROUTES = [
    Route("/schedules", index, name="schedules"),
    Route("/schedules/pause", pause, methods=["POST"], name="schedule_pause"),
    Route("/schedules/resume", resume, methods=["POST"], name="schedule_resume"),
    Route("/schedules/trigger", trigger, methods=["POST"], name="trigger"),
]
