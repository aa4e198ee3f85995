"""The watchdog: make a scheduled job that did not succeed in time loud.

``register(app)`` declares ``ops.watchdog.v1``; ``entry()`` schedules it every minute.
Each run looks at the entries that state an expectation (``expect=succeeds_by("04:00")``
or ``succeeds_within(minutes=N)``): an occurrence whose deadline passed in the last
``LOOKBACK`` without a success of it (or of a newer occurrence, read from
``schedule:last_success:<entry>``) raises one alarm:

- an error-level log line and one Sentry event (``conventions.observability.alerts.alert``),
- an audit event ``watchdog_alarm`` in the occurrence's own trail (its correlation id),
  which the metrics count by name, saying what the trail shows so far (nothing sent:
  beat is down; published, never started: no worker on the queue; skipped; dead letter).

One alarm per missed occurrence, whatever the number of watchdog runs: the store
reserves ``alarm:<occurrence key>``. The watchdog cannot see a beat that stopped
scheduling the watchdog itself: that is what Sentry Crons' monitor of this entry is for.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

from conventions.errors import ConfigurationError
from conventions.jobs import routing
from conventions.jobs.payloads import Payload
from conventions.observability import alerts, audit
from conventions.schedules import entries as schedules
from conventions.schedules import overlap, pauses
from conventions.schedules.entries import Entry, Occurrence
from conventions.store.base import Store
from conventions.task import ConventionTask
from conventions.tracing import headers as hdr
from conventions.worker.job_context import JobContext

logger = logging.getLogger("conventions.schedules.watchdog")

TASK = "ops.watchdog.v1"
#: deadlines missed longer ago than this are not reported (the watchdog was down)
LOOKBACK = dt.timedelta(hours=1)
#: how long a raised alarm is remembered (seconds): longer than ``LOOKBACK``
ALARM_KEEP = 2 * 86400.0


class WatchdogRun(Payload):
    """One watchdog check, named by its occurrence."""

    checked_at: dt.datetime


def register(app: Any, workload: str | None = None) -> ConventionTask:
    """Declare ``ops.watchdog.v1`` on ``app``, on ``workload`` (by default the one
    :func:`default_workload` chooses)."""
    chosen = workload if workload is not None else default_workload(app)

    def watchdog(payload: WatchdogRun, ctx: JobContext) -> int:
        """Check every expectation; return how many alarms were raised. Also takes the
        queues' sample of this minute for the console's charts (``ops.sampler``)."""
        from conventions.ops import sampler  # the broker reader: only where it runs

        sampler.sample(app)
        return len(check(app, ctx.task_id))

    declare = app.job(TASK, payload=WatchdogRun, key="watchdog:{checked_at}", workload=chosen)
    return declare(watchdog)  # type: ignore[no-any-return]


def default_workload(app: Any) -> str:
    """The watchdog's workload when ``register`` is given none: ``light`` when the app
    knows it (the default workloads do), else the workload routed to the app's default
    queue, else the app's only workload. An app with several and none of those must say
    which: the error names ``workload=`` (the watchdog is a short job; a light lane)."""
    known = routing.workloads(app.conf)
    if "light" in known:
        return "light"
    default_queue = app.conf.get("task_default_queue")
    on_default = [name for name, queue in known.items() if queue == default_queue]
    if on_default:
        return on_default[0]
    if len(known) == 1:
        return next(iter(known))
    raise ConfigurationError(
        f"{TASK}: no workload 'light' and none routed to the default queue "
        f"{default_queue!r}; pass the watchdog's workload: watchdog.register(app, "
        f"workload=...), one of {sorted(known)} (a queue of short jobs)"
    )


def entry(minutes: int = 1, *, seconds: float | None = None) -> Entry:
    """The watchdog's own schedule entry: a crontab every ``minutes`` (Sentry Crons can
    monitor it), or every ``seconds`` (tests; Sentry Crons skip it)."""
    cadence: schedules.Schedule = (
        schedules.every(seconds=seconds)
        if seconds is not None
        else schedules.crontab(minute="*" if minutes == 1 else f"*/{minutes}")
    )
    return Entry(
        "watchdog",
        TASK,
        cadence,
        payload=lambda occurrence: {"checked_at": occurrence.at},
        overlap="skip",
    )


def check(app: Any, checker_id: str | None = None) -> list[dict[str, Any]]:
    """Raise an alarm for each missed expectation not alarmed yet; return them."""
    schedules.use_clock(app.conf)
    store: Store = app.store
    current = schedules.now()
    checker = checker_id or uuid.uuid4().hex
    raised: list[dict[str, Any]] = []
    for item in schedules.entries_of(app):
        if item.expect is None or pauses.ENTRIES.get(store, item.name) is not None:
            continue  # a paused entry is expected to send nothing
        since = _watched_since(store, item.name, current)
        success = overlap.last_success(store, item.name)
        for occurrence in missed(item, success, current, since):
            alarm = _raise(store, item, occurrence, success, checker)
            if alarm is not None:
                raised.append(alarm)
    return raised


def _watched_since(store: Store, name: str, current: dt.datetime) -> dt.datetime:
    """When the watchdog first saw entry ``name``: occurrences before that are not its
    business (a new entry does not alarm for the hour before it was deployed)."""
    state = store.get_state(f"schedule:watched:{name}")
    if state is None:
        store.put_state(f"schedule:watched:{name}", {"since": current.isoformat()}, None)
        return current
    return dt.datetime.fromisoformat(str(state["since"]))


def missed(
    entry: Entry, success: dict[str, Any] | None, current: dt.datetime, since: dt.datetime
) -> list[Occurrence]:
    """The occurrences of ``entry`` after ``since`` whose deadline passed within
    ``LOOKBACK`` and that no success covers (a newer occurrence's success covers the older
    ones)."""
    assert entry.expect is not None
    expect = entry.expect
    start = max(since, current - LOOKBACK - dt.timedelta(seconds=expect.longest_wait()))
    succeeded = str((success or {}).get("occurrence", ""))
    out = []
    for moment in entry.schedule.between(start - dt.timedelta(microseconds=1), current):
        occurrence = entry.occurrence(moment)
        deadline = expect.deadline(occurrence)
        if current - LOOKBACK < deadline <= current and succeeded < moment.isoformat():
            out.append(occurrence)
    return out


def _raise(
    store: Store,
    entry: Entry,
    occurrence: Occurrence,
    success: dict[str, Any] | None,
    checker: str,
) -> dict[str, Any] | None:
    if store.reserve(f"alarm:{occurrence.key}", checker, ALARM_KEEP) is not None:
        return None  # alarmed already
    assert entry.expect is not None
    deadline = entry.expect.deadline(occurrence).astimezone(entry.schedule.zone)
    trail = [event.event for event in store.audit_for(occurrence.correlation_id)]
    seen = trail[-1] if trail else "nothing (never sent: is beat running?)"
    message = (
        f"schedule {entry.name}: occurrence {occurrence.label} of {entry.task} did not "
        f"succeed by {deadline.isoformat()}; last event: {seen}; last success: "
        f"{(success or {}).get('occurrence', 'never')}"
    )
    detail = {
        "schedule": entry.name,
        "occurrence": occurrence.label,
        "deadline": deadline.isoformat(),
        "last_event": trail[-1] if trail else None,
        "last_success": (success or {}).get("occurrence"),
    }
    headers = {
        hdr.CORRELATION: occurrence.correlation_id,
        hdr.CAUSATION: f"watchdog:{checker}",
        hdr.IDEMPOTENCY_KEY: occurrence.key,
    }
    audit.record(store, "watchdog_alarm", entry.task, checker, headers, detail=detail)
    tags = {"task": entry.task, "schedule": entry.name, "occurrence": occurrence.label}
    alerts.alert(message, exc=None, tags={**tags, "category": "watchdog"})
    return detail
