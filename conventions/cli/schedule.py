"""``conventions schedule``: list the entries, trigger an occurrence, run the watchdog.

    conventions schedule list [--json]
    conventions schedule trigger NAME [--at WHEN] [--actor NAME]
    conventions schedule check
    conventions schedule pause NAME --reason TEXT [--actor NAME]
    conventions schedule resume NAME [--actor NAME]

``trigger`` sends one occurrence exactly as beat would (the one at or before WHEN, an
ISO date or datetime; default: now): it runs once, whoever else sends it. Only the
current occurrence or one missed within the entry's catch-up window is sent; another is
refused (exit 2) and the refusal audited (``conventions.schedules.triggers``). ``check`` runs
the watchdog once (from a system cron it also watches a beat that is down). ``pause``
stops beat sending an entry's occurrences until ``resume`` (a trigger still sends one).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from conventions.cli import format as fmt
from conventions.cli.base import (
    REFUSED,
    USAGE,
    Failure,
    Group,
    actor_default,
    command,
    json_option,
    print_json,
)
from conventions.schedules import entries as schedules
from conventions.schedules import overlap, pauses, triggers, watchdog


@click.group("schedule", cls=Group)
def schedule_group() -> None:
    """Schedule entries: list, trigger, check."""


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
                "paused": pauses.ENTRIES.get(app.store, entry.name),
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
    default="",
    help="the occurrence at or before WHEN: an ISO date (that day in the entry's "
    "timezone) or datetime (UTC unless it says); default: the current one. Only the "
    "current occurrence or one missed within the entry's catch-up window is sent",
)
@click.option("--actor", default=actor_default, help="who triggers (default: $USER, else 'cli')")
def trigger_command(app: Any, name: str, at: str, actor: str) -> int:
    """Send one occurrence now, as beat would."""
    try:
        occurrence, result = triggers.send(app, name, at, actor)
    except triggers.NotOffered as exc:
        raise Failure(f"{name}: refused (audited): {exc}", USAGE) from exc
    if getattr(result, "deduplicated", False):
        print(f"{name}: that occurrence was already sent as {result.id}", file=sys.stderr)
        return REFUSED
    print(f"{name}: {occurrence.label} sent as {result.id}")
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
