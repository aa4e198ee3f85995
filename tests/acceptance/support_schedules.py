"""Test-only jobs and schedule entries for the schedule acceptance tests.

Beat and worker subprocesses load one entry list by name
(``CONVENTIONS_SCHEDULE=tests.acceptance.support_schedules:TWO_BEATS``); the worker
imports the jobs with ``--include``. Each job records what it ran in a store state
document, so a test reads the truth from the store, not from logs.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from conventions import Id, JobContext, Payload
from conventions.schedules import entries as schedules
from conventions.schedules import watchdog
from conventions.schedules.entries import Entry, Occurrence
from tasks import app

#: how long a ``slow`` run takes (seconds): longer than its 10 s interval
SLOW_SECONDS = 22.0


class Slot(Payload):
    slot: Id


class Report(Payload):
    business_date: dt.date


def slot(occurrence: Occurrence) -> dict[str, Any]:
    return {"slot": occurrence.label.replace(" ", "_")}


@app.job("testing.sched_tick.v1", payload=Slot, key="tick:{slot}", workload="light")
def tick(payload: Slot, ctx: JobContext) -> str:
    app.store.put_state(f"test:tick:{ctx.idempotency_key}", {"task_id": ctx.task_id}, 3600)
    return payload.slot


@app.job("testing.sched_slow.v1", payload=Slot, key="slow:{slot}", workload="light")
def slow(payload: Slot, ctx: JobContext) -> str:
    started = time.time()
    time.sleep(SLOW_SECONDS)
    app.store.put_state(f"test:slow:{payload.slot}", {"start": started, "end": time.time()}, 3600)
    return payload.slot


@app.job("testing.sched_report.v1", payload=Report, key="report:{business_date}", workload="heavy")
def report(payload: Report, ctx: JobContext) -> str:
    app.store.put_state(
        f"test:report:{ctx.idempotency_key}",
        {"business_date": payload.business_date.isoformat(), "task_id": ctx.task_id},
        3600,
    )
    return payload.business_date.isoformat()


@app.job("testing.sched_latest.v1", payload=Slot, key="latest:{slot}", workload="light")
def latest(payload: Slot, ctx: JobContext) -> str:
    """Works until told to stop (a newer ``replace`` occurrence), at most 8 s."""
    started = time.time()
    app.store.put_state(f"test:latest-body:{payload.slot}", {"start": started}, 3600)
    while not ctx.is_stopping() and time.time() - started < 8:
        time.sleep(0.1)
    app.store.put_state(
        f"test:latest:{payload.slot}",
        {"start": started, "end": time.time(), "stopped": ctx.is_stopping()},
        3600,
    )
    return payload.slot


TWO_BEATS = [Entry("tick", "testing.sched_tick.v1", schedules.every(minutes=1), payload=slot)]

#: 06:30 in Bangkok is 23:30 UTC the day before
BANGKOK = [
    Entry(
        "bkk-report",
        "testing.sched_report.v1",
        schedules.daily(at="06:30", tz="Asia/Bangkok"),
        payload=schedules.business_date(),
        overlap="allow",
        catch_up=3600,
    )
]

OVERLAP = [Entry("slow-sync", "testing.sched_slow.v1", schedules.every(seconds=10), payload=slot)]

WATCHDOG = [
    Entry(
        "late-report",
        "testing.sched_report.v1",
        schedules.daily(at="06:30", tz="Asia/Bangkok"),
        payload=schedules.business_date(),
        expect=schedules.succeeds_within(seconds=15),
    ),
    Entry(
        "on-time",
        "testing.sched_tick.v1",
        schedules.every(seconds=10),
        payload=slot,
        expect=schedules.succeeds_within(seconds=20),
    ),
    watchdog.entry(seconds=5),
]

REPLACE = Entry(
    "latest-wins", "testing.sched_latest.v1", schedules.every(seconds=10), payload=slot,
    overlap="replace",
)  # fmt: skip
