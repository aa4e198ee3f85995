"""Schedules through real beat and worker processes on real Redis: business keys in the
entry's timezone, the ``skip`` overlap policy, and the watchdog's alarm."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from conventions.schedules import watchdog
from tasks import app
from tests.acceptance import support_schedules as support
from tests.acceptance.schedule_helpers import beat_process, names
from tests.fixtures import ROOT
from tests.integration.helpers import wait_for

__all__ = ["beat_process"]  # the fixture, used by name

pytestmark = pytest.mark.usefixtures("clean_store")

INCLUDE = "tests.acceptance.support_schedules"
UTC = dt.UTC
#: 06:30 on 1 December in Bangkok: still 30 November in UTC
BANGKOK_0630 = dt.datetime(2026, 11, 30, 23, 30, tzinfo=UTC)


def _clock_env(entries: str, fake_now: dt.datetime | None = None) -> dict[str, str]:
    """The env of beat and worker: one entry list, and the clock at ``fake_now`` now."""
    env = {"CONVENTIONS_SCHEDULE": f"{INCLUDE}:{entries}"}
    if fake_now is not None:
        offset = (fake_now - dt.datetime.now(UTC)).total_seconds()
        env["CONVENTIONS_CLOCK_OFFSET_SECONDS"] = f"{offset:.3f}"
    return env


# 22 s of a real beat window: in make chaos (make test's 20 minutes)
@pytest.mark.chaos
def test_a_daily_bangkok_entry_names_the_bangkok_day_across_the_utc_day_boundary(
    worker_process: Callable[..., Any], beat_process: Callable[..., Any]
) -> None:
    env = _clock_env("BANGKOK", BANGKOK_0630 - dt.timedelta(seconds=20))
    worker_process("bkk", "heavy", include=INCLUDE, **env)
    beat_process("bkk-beat", **env)
    key = "beat:bkk-report:2026-12-01"
    ran = wait_for(lambda: app.store.get_state(f"test:report:{key}"), timeout=90, every=0.5)
    assert ran["business_date"] == "2026-12-01"  # the Bangkok day, not UTC's 30 November
    occurrence = support.BANGKOK[0].occurrence(BANGKOK_0630)
    assert occurrence.key == key
    events = wait_for(lambda: _until(occurrence.correlation_id, "succeeded"), timeout=30)
    assert names(events) == ["published", "started", "succeeded"]
    assert events[0].causation_id == "beat:bkk-report"
    assert events[0].idempotency_key == key

    trigger = subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", "schedule", "trigger", "bkk-report",
         "--at", "2026-12-01"],
        check=False, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert trigger.returncode == 1, trigger.stderr
    assert f"already sent as {ran['task_id']}" in trigger.stderr
    trail = names(app.store.audit_for(occurrence.correlation_id))
    assert trail == ["published", "started", "succeeded", "deduplicated"]


@pytest.mark.chaos  # a 35 s window of real beat ticks: a long run, in `make chaos`
def test_a_skip_entry_whose_job_outlasts_its_interval_never_runs_twice_at_once(
    worker_process: Callable[..., Any], beat_process: Callable[..., Any]
) -> None:
    env = _clock_env("OVERLAP")
    entry = support.OVERLAP[0]
    worker_process("slow", "email", concurrency=2, include=INCLUDE, **env)
    started = dt.datetime.now(UTC)
    beat = beat_process("slow-beat", **env)
    time.sleep(35)
    beat.stop()
    stopped = dt.datetime.now(UTC)
    sent = [
        entry.occurrence(moment)
        for moment in entry.schedule.between(started - dt.timedelta(seconds=10), stopped)
        if app.store.audit_for(entry.occurrence(moment).correlation_id)
    ]
    assert len(sent) >= 3, "beat sent too few occurrences"
    outcomes = {
        occurrence.label: wait_for(
            lambda o=occurrence: _outcome(o.correlation_id), timeout=60, every=0.5
        )
        for occurrence in sent
    }
    skipped = [label for label, (outcome, _) in outcomes.items() if outcome == "skipped"]
    ran = [label for label, (outcome, _) in outcomes.items() if outcome == "succeeded"]
    assert len(ran) >= 1 and len(skipped) >= 1, outcomes
    assert all("overlap" in reason for outcome, reason in outcomes.values() if outcome == "skipped")
    runs = sorted(
        (doc["start"], doc["end"])
        for label in ran
        if (doc := app.store.get_state(f"test:slow:{label}")) is not None
    )
    assert len(runs) == len(ran)
    for (_, previous_end), (start, _) in itertools.pairwise(runs):
        assert start >= previous_end, f"two runs overlapped: {runs}"


@pytest.mark.chaos  # minutes of watchdog runs on real beat ticks: a long run, in `make chaos`
def test_with_no_worker_on_the_entrys_queue_the_watchdog_raises_one_alarm_in_the_window(
    worker_process: Callable[..., Any], beat_process: Callable[..., Any]
) -> None:
    fake_start = BANGKOK_0630 - dt.timedelta(seconds=20)
    env = _clock_env("WATCHDOG", fake_start)
    offset = dt.timedelta(seconds=float(env["CONVENTIONS_CLOCK_OFFSET_SECONDS"]))
    worker = worker_process("watch", "email", include=INCLUDE, **env)  # nobody on heavy
    beat_process("watch-beat", **env)
    late, on_time = support.WATCHDOG[0], support.WATCHDOG[1]
    occurrence = late.occurrence(BANGKOK_0630)
    deadline = BANGKOK_0630 + dt.timedelta(seconds=15) - offset  # real time

    alarms = wait_for(lambda: _events(occurrence.correlation_id, "watchdog_alarm"), timeout=120)
    alarm = alarms[0]
    assert deadline - dt.timedelta(seconds=1) <= alarm.at <= deadline + dt.timedelta(seconds=40)
    assert alarm.detail["last_event"] == "published"  # sent, never started: no worker
    assert alarm.detail["occurrence"] == "2026-12-01"
    checked = _watchdog_runs()
    wait_for(lambda: _watchdog_runs() >= checked + 2, timeout=60)  # two more checks ...
    assert len(_events(occurrence.correlation_id, "watchdog_alarm")) == 1  # ... one alarm
    assert "late-report: occurrence 2026-12-01 of testing.sched_report.v1 did not succeed" in (
        worker.output()
    )
    fake_now = dt.datetime.now(UTC) + offset
    for moment in on_time.schedule.between(fake_start, fake_now - dt.timedelta(seconds=25)):
        trail = app.store.audit_for(on_time.occurrence(moment).correlation_id)
        assert "watchdog_alarm" not in names(trail), trail


def _watchdog_runs() -> int:
    """The watchdog's checks that ran to the end so far (its run records)."""
    return len(app.store.list_runs(task=watchdog.TASK, state="succeeded", limit=10_000))


def _events(correlation_id: str, name: str) -> list[Any]:
    return [e for e in app.store.audit_for(correlation_id) if e.event == name]


def _until(correlation_id: str, name: str) -> list[Any] | None:
    events = app.store.audit_for(correlation_id)
    return events if name in names(events) else None


def _outcome(correlation_id: str) -> tuple[str, str] | None:
    """How an occurrence's run ended: (``succeeded`` or ``skipped``, the reason)."""
    for event in app.store.audit_for(correlation_id):
        if event.event in ("succeeded", "skipped", "dead_lettered"):
            return event.event, str(event.detail.get("reason", ""))
    return None
