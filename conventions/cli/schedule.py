"""``conventions schedule``: list the entries, trigger an occurrence, run the watchdog.

    conventions schedule list
    conventions schedule trigger NAME [--at WHEN]
    conventions schedule check

``trigger`` sends one occurrence exactly as beat would (the one at or before WHEN, an
ISO date or datetime; default: now): it runs once, whoever else sends it. ``check`` runs
the watchdog once (from a system cron it also watches a beat that is down).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, TextIO
from zoneinfo import ZoneInfo

from conventions.schedules import beat as scheduler
from conventions.schedules import entries as schedules
from conventions.schedules import overlap, watchdog


def add_parser(commands: Any) -> None:
    """Add the ``schedule`` command to the CLI's subparsers."""
    schedule = commands.add_parser("schedule", help="schedule entries: list, trigger, check")
    actions = schedule.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")
    actions.add_parser("list", help="entries, their next occurrence and last success")
    trigger = actions.add_parser("trigger", help="send one occurrence now, as beat would")
    trigger.add_argument("name", metavar="NAME", help="the entry's name")
    trigger.add_argument(
        "--at",
        metavar="WHEN",
        help="the occurrence at or before WHEN: an ISO date (that day in the entry's "
        "timezone) or datetime (UTC unless it says); default: now",
    )
    actions.add_parser("check", help="run the watchdog once; exit 1 when it raised alarms")


def _when(text: str | None, zone: ZoneInfo) -> datetime | None:
    if not text:
        return None
    if len(text) == 10:  # a date: its last occurrence, in the entry's timezone
        day = date.fromisoformat(text)
        return datetime.combine(day + timedelta(days=1), time(), tzinfo=zone) - timedelta(
            microseconds=1
        )
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _list(app: Any, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    schedules.use_clock(app.conf)
    current = schedules.now()
    for entry in schedules.entries_of(app):
        upcoming = entry.occurrence(entry.schedule.next_after(current))
        success = overlap.last_success(app.store, entry.name) or {}
        print(
            f"{entry.name:<20} {entry.task:<28} {entry.schedule!r} overlap={entry.overlap} "
            f"next={upcoming.label} last_success={success.get('occurrence', 'never')}",
            file=out,
        )
    return 0


def _trigger(app: Any, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    schedules.use_clock(app.conf)
    entry = schedules.find(app, args.name)
    result = scheduler.trigger(app, args.name, _when(args.at, entry.schedule.zone))
    if getattr(result, "deduplicated", False):
        print(f"{args.name}: that occurrence was already sent as {result.id}", file=err)
        return 1
    print(f"{args.name}: sent as {result.id}", file=out)
    return 0


def _check(app: Any, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    alarms = watchdog.check(app)
    for alarm in alarms:
        print(f"ALARM {alarm['schedule']} {alarm['occurrence']}: due {alarm['deadline']}", file=out)
    return 1 if alarms else 0


COMMANDS: dict[tuple[str, str | None], Callable[..., int]] = {
    ("schedule", "list"): _list,
    ("schedule", "trigger"): _trigger,
    ("schedule", "check"): _check,
}
