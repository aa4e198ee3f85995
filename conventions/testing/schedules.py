"""Schedules on the virtual clock: a virtual day (or week) of beat, in a few milliseconds.

``run_schedule`` walks the virtual clock from one occurrence of the app's
``conventions_schedule`` to the next and, at each, does what the layer's beat scheduler
(:class:`conventions.schedules.beat.Scheduler`) does when an entry is due: every
occurrence in the entry's window goes through :func:`conventions.schedules.beat.send`,
with its business key (``beat:<entry>:<label>``), its correlation id and the
``cc_schedule`` headers, deduplicated by the store. The jobs sent are captured like any
publish; with ``run_jobs`` they also run as the clock passes them (so the watchdog sees
their successes), else they wait for the test.

The watchdog's own entry (``ops.watchdog.v1``, every minute) is left out unless
``entries`` names it: a virtual week of it is 10,080 jobs that check nothing the test
asks about. Its check runs at the virtual now when the test asks
(``JobKit.watchdog_alarms``), which is what it would find then.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from conventions.schedules import beat, watchdog
from conventions.schedules import entries as schedules
from conventions.schedules.entries import Entry, Occurrence
from conventions.store.base import Store
from conventions.testing.capture import Capture
from conventions.testing.drain import drain


@dataclass(frozen=True)
class Sent:
    """One occurrence beat sent (or found sent already: ``deduplicated``)."""

    entry: str
    occurrence: Occurrence
    task: str
    task_id: str
    deduplicated: bool

    @property
    def key(self) -> str:
        """The occurrence's business key (``beat:daily-report:2026-12-01``)."""
        return self.occurrence.key

    @property
    def label(self) -> str:
        return self.occurrence.label

    @property
    def at(self) -> datetime:
        return self.occurrence.at


def _next(entries: list[Entry], last: dict[str, datetime]) -> datetime:
    return min(entry.schedule.next_after(last[entry.name]) for entry in entries)


def chosen_entries(every: list[Entry], names: list[str] | None) -> list[Entry]:
    """The entries ``run_schedule`` sends: those named, else all but the watchdog's."""
    if names is None:
        return [entry for entry in every if entry.task != watchdog.TASK]
    unknown = sorted(set(names) - {entry.name for entry in every})
    if unknown:
        raise ValueError(
            f"run_schedule(entries=...): no schedule entry named {unknown}; the schedule "
            f"has {sorted(entry.name for entry in every)}"
        )
    return [entry for entry in every if entry.name in names]


def run_schedule(
    app: Any,
    capture: Capture,
    store: Store,
    duration: timedelta,
    *,
    entries: list[str] | None = None,
    run_jobs: bool = False,
) -> list[Sent]:
    """Beat for ``duration`` of virtual time from now: the occurrences sent, in order.
    ``entries`` limits it to the entries of those names (the watchdog's entry runs only
    when named); a name the schedule does not have is a ``ValueError``."""
    clock = capture.clock
    chosen = chosen_entries(schedules.entries_of(app), entries)
    end = clock.now() + duration
    start = clock.now()
    # as beat_schedule: a new entry starts one window back
    last = {e.name: start - timedelta(seconds=e.schedule.window()) for e in chosen}
    sent: list[Sent] = []
    while chosen:
        moment = _next(chosen, last)
        if moment > end:
            break
        clock.advance_to(moment)
        now = schedules.now()
        for entry in chosen:
            due = entry.schedule.due(last[entry.name], now)
            for at in due:
                occurrence = entry.occurrence(at)
                result = beat.send(app, entry, occurrence)
                if result is None:  # the entry is paused
                    continue
                sent.append(
                    Sent(entry.name, occurrence, entry.task, str(result.id),
                         bool(getattr(result, "deduplicated", False)))
                )  # fmt: skip
            if due:
                last[entry.name] = now
        if run_jobs:
            drain(app, capture, store, until=clock.now())
    clock.advance_to(end)
    if run_jobs:
        drain(app, capture, store, until=clock.now())
    return sent


def alarms(app: Any) -> list[dict[str, Any]]:
    """Run the watchdog's check once, at the virtual now: the alarms it raised (each
    missed expectation once, as in production)."""
    return watchdog.check(app)
