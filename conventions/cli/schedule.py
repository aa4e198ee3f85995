"""``conventions schedule``: list the entries, trigger an occurrence, run the watchdog.

    conventions schedule list [--json]
    conventions schedule trigger NAME [--at WHEN]
    conventions schedule check
    conventions schedule pause NAME --reason TEXT [--actor NAME]
    conventions schedule resume NAME [--actor NAME]

``trigger`` sends one occurrence exactly as beat would (the one at or before WHEN, an
ISO date or datetime; default: now): it runs once, whoever else sends it. ``check`` runs
the watchdog once (from a system cron it also watches a beat that is down). ``pause``
stops beat sending an entry's occurrences until ``resume`` (a trigger still sends one).
"""

from __future__ import annotations

import sys
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import click

from conventions.cli import format as fmt
from conventions.cli.base import (
    REFUSED,
    Failure,
    Group,
    actor_default,
    command,
    json_option,
    print_json,
)
from conventions.schedules import beat as scheduler
from conventions.schedules import entries as schedules
from conventions.schedules import overlap, pauses, watchdog


@click.group("schedule", cls=Group)
def schedule_group() -> None:
    """Schedule entries: list, trigger, check."""


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


@command("list")
@json_option
def list_command(app: Any, as_json: bool) -> int:
    """Entries, their next occurrence and last success."""
    schedules.use_clock(app.conf)
    current = schedules.now()
    rows: list[dict[str, Any]] = []
    for entry in schedules.entries_of(app):
        upcoming = entry.occurrence(entry.schedule.next_after(current))
        success = overlap.last_success(app.store, entry.name) or {}
        rows.append(
            {
                "name": entry.name,
                "task": entry.task,
                "schedule": repr(entry.schedule),
                "overlap": entry.overlap,
                "next": upcoming.label,
                "last_success": success.get("occurrence"),
                "paused": pauses.paused(app.store, entry.name),
            }
        )
    if as_json:
        print_json(rows)
    for row in [] if as_json else rows:
        print(
            f"{row['name']:<20} {row['task']:<28} {row['schedule']} overlap={row['overlap']} "
            f"next={row['next']} last_success={row['last_success'] or 'never'}"
            + (f" paused_by={fmt.shown(row['paused'].get('actor'))}" if row["paused"] else "")
        )
    return 0


@command("trigger")
@click.argument("name", metavar="NAME")
@click.option(
    "--at",
    metavar="WHEN",
    help="the occurrence at or before WHEN: an ISO date (that day in the entry's "
    "timezone) or datetime (UTC unless it says); default: now",
)
def trigger_command(app: Any, name: str, at: str | None) -> int:
    """Send one occurrence now, as beat would."""
    schedules.use_clock(app.conf)
    entry = schedules.find(app, name)
    try:
        moment = _when(at, entry.schedule.zone)
    except ValueError as exc:
        raise Failure(f"--at {at!r}: {exc}", 2) from exc
    result = scheduler.trigger(app, name, moment)
    if getattr(result, "deduplicated", False):
        print(f"{name}: that occurrence was already sent as {result.id}", file=sys.stderr)
        return REFUSED
    print(f"{name}: sent as {result.id}")
    return 0


@command("check")
def check_command(app: Any) -> int:
    """Run the watchdog once; exit 1 when it raised alarms."""
    alarms = watchdog.check(app)
    for alarm in alarms:
        print(f"ALARM {alarm['schedule']} {alarm['occurrence']}: due {alarm['deadline']}")
    return REFUSED if alarms else 0


@command("pause")
@click.argument("name", metavar="NAME")
@click.option("--reason", required=True, help="why (kept in the audit trail)")
@click.option("--actor", default=actor_default, help="who pauses (default: $USER, else 'cli')")
def pause_command(app: Any, name: str, reason: str, actor: str) -> int:
    """Stop beat sending an entry's occurrences until it is resumed."""
    try:
        pauses.pause(app, name, actor=actor, reason=reason)
    except ValueError as exc:
        raise Failure(f"--reason: {exc}", 2) from exc
    print(f"{name}: paused; beat sends none of its occurrences until it is resumed")
    return 0


@command("resume")
@click.argument("name", metavar="NAME")
@click.option("--actor", default=actor_default, help="who resumes (default: $USER, else 'cli')")
def resume_command(app: Any, name: str, actor: str) -> int:
    """Let beat send an entry again, from its next occurrence."""
    if not pauses.resume(app, name, actor=actor):
        print(f"{name}: was not paused", file=sys.stderr)
        return REFUSED
    print(f"{name}: resumed; beat sends it from its next occurrence")
    return 0


for _command in (list_command, trigger_command, check_command, pause_command, resume_command):
    schedule_group.add_command(_command)
#: the commands this module adds to ``conventions``
COMMANDS = (schedule_group,)
