"""``conventions dlq``, ``trace`` and ``retention``: dead letters, a story, old records.

conventions dlq list [--task T] [--category C] [--since WHEN] [--limit N] [--json]
conventions dlq show ID [--json]
conventions dlq replay ID... --reason TEXT [--force] [--actor NAME] [--json]
conventions dlq replay --all --task T --reason TEXT [--force] [--actor NAME] [--json]
conventions dlq purge --older-than DURATION
conventions dlq poison [--json]
conventions trace CORRELATION_ID [--json]
conventions retention [--dead-letters 30d] [--audit 14d]
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import click

from conventions.app import App
from conventions.cli import format as fmt
from conventions.cli.base import (
    REFUSED,
    USAGE,
    Failure,
    Group,
    Parsed,
    actor_default,
    command,
    json_option,
    positive,
    print_json,
)
from conventions.config import durations
from conventions.observability import shown
from conventions.observability import trace as tracing
from conventions.ops import replay as replaylib
from conventions.ops.retention import (
    AUDIT_RETENTION,
    DEAD_LETTER_RETENTION,
    RUNS_RETENTION,
    purge_expired,
)
from conventions.store.records import Category

DURATION = Parsed(durations.parse_duration, "DURATION")
SINCE = Parsed(durations.parse_since, "WHEN")


@click.group("dlq", cls=Group)
def dlq() -> None:
    """Dead letters: list, show, replay, purge."""


@command("list")
@click.option("--task", help="only this task (a full name, e.g. email.send.v1)")
@click.option("--category", type=click.Choice([str(c) for c in Category]))
@click.option(
    "--since",
    type=SINCE,
    metavar="WHEN",
    help="last failure at or after WHEN: an ISO date/datetime (UTC unless it says) "
    "or a duration meaning that long ago (30m, 2h, 7d)",
)
@click.option("--limit", type=positive(int), default=50, show_default=True, metavar="N")
@json_option
def list_(
    app: App,
    *,
    task: str | None,
    category: str | None,
    since: datetime | None,
    limit: int,
    as_json: bool,
) -> int:
    """List dead letters, newest first."""
    found = app.store.list_dead_letters(
        task=task, category=Category(category) if category else None, since=since, limit=limit
    )
    records = [shown.dead_letter(app, record) for record in found]
    if as_json:
        print_json([r.to_dict() for r in records])
    elif records:
        print(fmt.dead_letter_table(records))
    else:
        print("no dead letters", file=sys.stderr)
    return 0


@command("show")
@click.argument("record_id", metavar="ID")
@json_option
def show(app: App, record_id: str, as_json: bool) -> int:
    """One dead letter in full."""
    found = app.store.get_dead_letter(record_id)
    if found is None:
        print(f"conventions: no dead letter with id {record_id!r}", file=sys.stderr)
        return REFUSED
    record = shown.dead_letter(app, found)  # scrubbed as the console shows it
    if as_json:
        print_json(record.to_dict())
    else:
        print(fmt.dead_letter_detail(record))
    return 0


def check_replay(
    ids: tuple[str, ...], every: bool, task: str | None, reason: str, **_: object
) -> None:
    """IDs, or ``--all --task T`` (not both), and a reason that says something."""
    if every != bool(task) or every == bool(ids):
        raise Failure(
            "dlq replay takes IDs, or --all --task T (not both; --task goes with --all)", USAGE
        )
    if not reason.strip():
        raise Failure("dlq replay: --reason must not be empty", USAGE)


@command("replay", before=check_replay)
@click.argument("ids", nargs=-1, metavar="ID...")
@click.option("--all", "every", is_flag=True, help="every dead letter of --task not replayed yet")
@click.option("--task", help="with --all: the task whose dead letters to replay")
@click.option("--reason", required=True, help="why (kept in the audit trail)")
@click.option(
    "--force", is_flag=True, help="replay a replayable=False task or an already replayed record"
)
@click.option("--actor", default=actor_default, help="who replays (default: $USER, else 'cli')")
@json_option
def replay(
    app: App,
    *,
    ids: tuple[str, ...],
    every: bool,
    task: str | None,
    reason: str,
    force: bool,
    actor: str,
    as_json: bool,
) -> int:
    """Publish dead letters again (same payload, key and correlation id)."""
    if every and task:
        outcomes = replaylib.replay_many(app, task=task, reason=reason, actor=actor, force=force)
        if not outcomes:
            print(f"no dead letters of {task} waiting for a replay", file=sys.stderr)
    else:
        outcomes = []
        for record_id in ids:
            try:
                result = replaylib.replay(app, record_id, reason=reason, actor=actor, force=force)
            except (PermissionError, LookupError, ValueError) as exc:
                outcomes.append(replaylib.ReplayOutcome(record_id, error=str(exc)))
            else:
                outcomes.append(replaylib.ReplayOutcome(record_id, result=result))
    report = [fmt.replay_report(outcome) for outcome in outcomes]
    if as_json:
        print_json(report)
    for item in report:
        if item["status"] == "replayed":
            if not as_json:
                print(f"replayed {item['dead_letter_id']} as job {item['task_id']}")
        else:
            print(
                f"conventions: {item['status']} {item['dead_letter_id']}: {item['error']}",
                file=sys.stderr,
            )
    return 0 if all(item["status"] == "replayed" for item in report) else REFUSED


@command("purge")
@click.option(
    "--older-than",
    required=True,
    type=DURATION,
    metavar="DURATION",
    help="last failure longer ago than this (e.g. 30d)",
)
def purge(app: App, older_than: timedelta) -> int:
    """Delete old dead letters."""
    before = datetime.now(UTC) - older_than
    count = app.store.purge_dead_letters(before)
    print(f"deleted {count} dead letters last failed before {fmt.when(before)}")
    return 0


@command("poison")
@json_option
def poison(app: App, as_json: bool) -> int:
    """Record RabbitMQ's poison queue now (every worker also reads it)."""
    from conventions.config import settings
    from conventions.worker import poison_queue

    if not settings.quorum_queues(app.conf):
        raise Failure(
            "the app's queues are not RabbitMQ quorum queues (reliable() on an amqp:// "
            "broker): there is no poison queue to read",
            USAGE,
        )
    acked, left = poison_queue.drain(app, worker="cli")
    name = settings.poison_queue(app.conf)
    if as_json:
        print_json({"queue": name, "acked": acked, "left": left})
    else:
        print(f"{name}: {acked} acked (recorded as poison dead letters), {left} left")
    return REFUSED if left else 0


@command("trace")
@click.argument("correlation_id", metavar="CORRELATION_ID")
@json_option
def trace(app: App, correlation_id: str, as_json: bool) -> int:
    """Every job and event of one correlation id."""
    roots = tracing.build_trace(shown.audit_events(app, app.store.audit_for(correlation_id)))
    if as_json:
        print_json({"correlation_id": correlation_id, "jobs": [j.to_dict() for j in roots]})
    else:
        print(fmt.trace_text(correlation_id, roots), file=sys.stdout if roots else sys.stderr)
    return 0 if roots else REFUSED


@command("retention")
@click.option(
    "--dead-letters",
    type=DURATION,
    default=f"{DEAD_LETTER_RETENTION.days}d",
    metavar="DURATION",
    help=f"keep dead letters this long (default {DEAD_LETTER_RETENTION.days}d)",
)
@click.option(
    "--audit",
    type=DURATION,
    default=f"{AUDIT_RETENTION.days}d",
    metavar="DURATION",
    help=f"keep audit events this long (default {AUDIT_RETENTION.days}d)",
)
@click.option(
    "--runs",
    type=DURATION,
    default=f"{RUNS_RETENTION.days}d",
    metavar="DURATION",
    help=f"keep runs this long after they were queued (default {RUNS_RETENTION.days}d)",
)
def retention(app: App, dead_letters: timedelta, audit: timedelta, runs: timedelta) -> int:
    """Purge old dead letters, audit events and runs."""
    now = datetime.now(UTC)
    count = app.store.purge_dead_letters(now - dead_letters)
    print(f"deleted {count} dead letters last failed before {fmt.when(now - dead_letters)}")
    count = app.store.purge_audit(now - audit)
    print(f"deleted {count} audit events of trails idle since before {fmt.when(now - audit)}")
    count = app.store.purge_runs(now - runs)
    print(f"deleted {count} runs queued before {fmt.when(now - runs)}")
    for table, count in purge_expired(app.store).items():
        print(f"deleted {count} expired {table} rows")
    return 0


for _command in (list_, show, replay, purge, poison):
    dlq.add_command(_command)
#: the commands this module adds to ``conventions``
COMMANDS = (dlq, trace, retention)
