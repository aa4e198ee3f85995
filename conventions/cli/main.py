"""The ``conventions`` command: triage and replay dead letters, trace a story, purge.

    conventions [-A MODULE[:ATTR]] dlq list [--task T] [--category C] [--since D]
                                            [--limit N] [--json]
    conventions dlq show ID [--json]
    conventions dlq replay ID... --reason TEXT [--force] [--actor NAME] [--json]
    conventions dlq replay --all --task T --reason TEXT [--force] [--actor NAME] [--json]
    conventions dlq purge --older-than DURATION
    conventions trace CORRELATION_ID [--json]
    conventions retention [--dead-letters 30d] [--audit 14d]
    conventions metrics serve [--port 9808]       (see conventions.cli.observe)
    conventions queues [--json] [--watch]
    conventions doctor [--json] [--static] [--timeout S]
    conventions status TASK_ID [--json]
    conventions outbox relay|status|init ...   (see conventions.cli.outbox)
    conventions schedule list | trigger NAME [--at WHEN] | check
    conventions keys show KEY | clear KEY --reason TEXT [--actor NAME]   (conventions.cli.keys)

The app is imported by name (``-A``, else ``$CONVENTIONS_APP``, else ``tasks``): the
layer never imports a project's tasks module itself. Exit status: 0 done, 1 something
was refused or not found, 2 a usage error (a bad option, an app that does not import).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from conventions.app import App
from conventions.cli import format as fmt
from conventions.cli import keys as cli_keys
from conventions.cli import lifecycle as cli_lifecycle
from conventions.cli import observe as cli_observe
from conventions.cli import outbox as cli_outbox
from conventions.cli import schedule as cli_schedule
from conventions.errors import ConfigurationError
from conventions.ops import replay as replaylib
from conventions.ops.retention import AUDIT_RETENTION, DEAD_LETTER_RETENTION, purge_expired
from conventions.store.records import Category


class UsageError(Exception):
    """A usage problem found after parsing (exit status 2)."""


def _argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be a positive whole number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conventions", description="Triage and replay dead letters, trace jobs, purge."
    )
    parser.add_argument(
        "-A",
        "--app",
        default=os.environ.get("CONVENTIONS_APP") or "tasks",
        help="the Celery app: MODULE (its attribute 'app') or MODULE:ATTR "
        "(default: $CONVENTIONS_APP, else 'tasks')",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dlq = commands.add_parser("dlq", help="dead letters: list, show, replay, purge")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = dlq_commands.add_parser("list", help="list dead letters, newest first")
    listing.add_argument("--task", help="only this task (a full name, e.g. email.send.v1)")
    listing.add_argument("--category", choices=[str(c) for c in Category])
    listing.add_argument(
        "--since",
        type=_argtype(fmt.parse_since),
        metavar="WHEN",
        help="last failure at or after WHEN: an ISO date/datetime (UTC unless it says) "
        "or a duration meaning that long ago (30m, 2h, 7d)",
    )
    listing.add_argument("--limit", type=_argtype(_positive_int), default=50)
    listing.add_argument("--json", action="store_true", help="print JSON")

    show = dlq_commands.add_parser("show", help="one dead letter in full")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="print JSON")

    replay = dlq_commands.add_parser(
        "replay", help="publish dead letters again (same payload, key and correlation id)"
    )
    replay.add_argument("ids", nargs="*", metavar="ID", help="dead letter ids")
    replay.add_argument(
        "--all", action="store_true", help="every dead letter of --task not replayed yet"
    )
    replay.add_argument("--task", help="with --all: the task whose dead letters to replay")
    replay.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    replay.add_argument(
        "--force",
        action="store_true",
        help="replay a replayable=False task or an already replayed record",
    )
    replay.add_argument(
        "--actor",
        default=os.environ.get("USER") or "cli",
        help="who replays (default: $USER, else 'cli')",
    )
    replay.add_argument("--json", action="store_true", help="print JSON")
    replay.set_defaults(usage_error=replay.error)

    purge = dlq_commands.add_parser("purge", help="delete old dead letters")
    purge.add_argument(
        "--older-than",
        required=True,
        type=_argtype(fmt.parse_duration),
        metavar="DURATION",
        help="last failure longer ago than this (e.g. 30d)",
    )

    trace = commands.add_parser("trace", help="every job and event of one correlation id")
    trace.add_argument("correlation_id", metavar="CORRELATION_ID")
    trace.add_argument("--json", action="store_true", help="print JSON")

    retention = commands.add_parser("retention", help="purge old dead letters and audit")
    retention.add_argument(
        "--dead-letters",
        type=_argtype(fmt.parse_duration),
        default=DEAD_LETTER_RETENTION,
        metavar="DURATION",
        help=f"keep dead letters this long (default {DEAD_LETTER_RETENTION.days}d)",
    )
    retention.add_argument(
        "--audit",
        type=_argtype(fmt.parse_duration),
        default=AUDIT_RETENTION,
        metavar="DURATION",
        help=f"keep audit events this long (default {AUDIT_RETENTION.days}d)",
    )
    cli_observe.add_commands(commands)
    cli_lifecycle.add_parsers(commands)
    cli_outbox.add_parser(commands)
    cli_schedule.add_parser(commands)
    cli_keys.add_parser(commands)
    return parser


def load_app(spec: str) -> App:
    """Import ``MODULE`` (attribute ``app``) or ``MODULE:ATTR`` and check it is an App."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like ``celery -A``: the project's own modules
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import the app module {module_name!r}: {exc}") from exc
    app = getattr(module, attr or "app", None)
    if not isinstance(app, App):
        raise UsageError(
            f"{module_name}:{attr or 'app'} is not a conventions.App (got {type(app).__name__}): "
            "pass -A MODULE or -A MODULE:ATTR naming the project's app"
        )
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "dlq" and args.dlq_command == "replay":
        if args.all != bool(args.task) or args.all == bool(args.ids):
            args.usage_error("takes IDs, or --all --task T (not both; --task goes with --all)")
        if not args.reason.strip():
            args.usage_error("--reason must not be empty")
    cli_keys.check(args)
    try:
        app = load_app(args.app)
        sub = (
            getattr(args, "dlq_command", None)
            or getattr(args, "outbox_command", None)
            or getattr(args, "schedule_command", None)
            or getattr(args, "keys_command", None)
        )
        command = COMMANDS[(args.command, sub)]
        return command(app, args, sys.stdout, sys.stderr)
    except UsageError as exc:
        print(f"conventions: error: {exc}", file=sys.stderr)
        return 2
    except ConfigurationError as exc:
        print(f"conventions: error: {exc}", file=sys.stderr)
        return 2


def _print_json(data: Any, out: TextIO) -> None:
    print(json.dumps(data, indent=2, default=str), file=out)


def _dlq_list(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    category = Category(args.category) if args.category else None
    records = app.store.list_dead_letters(
        task=args.task, category=category, since=args.since, limit=args.limit
    )
    if args.json:
        _print_json([r.to_dict() for r in records], out)
    elif records:
        print(fmt.dead_letter_table(records), file=out)
    else:
        print("no dead letters", file=err)
    return 0


def _dlq_show(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    record = app.store.get_dead_letter(args.id)
    if record is None:
        print(f"conventions: no dead letter with id {args.id!r}", file=err)
        return 1
    if args.json:
        _print_json(record.to_dict(), out)
    else:
        print(fmt.dead_letter_detail(record), file=out)
    return 0


def _dlq_replay(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.all:
        outcomes = replaylib.replay_many(
            app, task=args.task, reason=args.reason, actor=args.actor, force=args.force
        )
        if not outcomes:
            print(f"no dead letters of {args.task} waiting for a replay", file=err)
    else:
        outcomes = []
        for record_id in args.ids:
            try:
                result = replaylib.replay(
                    app, record_id, reason=args.reason, actor=args.actor, force=args.force
                )
            except (PermissionError, LookupError, ValueError) as exc:
                outcomes.append(replaylib.ReplayOutcome(record_id, error=str(exc)))
            else:
                outcomes.append(replaylib.ReplayOutcome(record_id, result=result))
    report = [fmt.replay_report(outcome) for outcome in outcomes]
    if args.json:
        _print_json(report, out)
    for item in report:
        if item["status"] == "replayed":
            if not args.json:
                print(f"replayed {item['dead_letter_id']} as job {item['task_id']}", file=out)
        else:
            print(
                f"conventions: {item['status']} {item['dead_letter_id']}: {item['error']}", file=err
            )
    return 0 if all(item["status"] == "replayed" for item in report) else 1


def _dlq_purge(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    before = datetime.now(UTC) - args.older_than
    count = app.store.purge_dead_letters(before)
    print(f"deleted {count} dead letters last failed before {fmt.when(before)}", file=out)
    return 0


def _trace(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    roots = fmt.build_trace(app.store.audit_for(args.correlation_id))
    if args.json:
        _print_json(
            {"correlation_id": args.correlation_id, "jobs": [job.to_dict() for job in roots]}, out
        )
    else:
        print(fmt.trace_text(args.correlation_id, roots), file=out if roots else err)
    return 0 if roots else 1


def _retention(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    now = datetime.now(UTC)
    dead_letters: timedelta = args.dead_letters
    audit: timedelta = args.audit
    count = app.store.purge_dead_letters(now - dead_letters)
    print(
        f"deleted {count} dead letters last failed before {fmt.when(now - dead_letters)}", file=out
    )
    count = app.store.purge_audit(now - audit)
    print(
        f"deleted {count} audit events of trails idle since before {fmt.when(now - audit)}",
        file=out,
    )
    for table, count in purge_expired(app.store).items():
        print(f"deleted {count} expired {table} rows", file=out)
    return 0


Command = Callable[[App, argparse.Namespace, TextIO, TextIO], int]
COMMANDS: dict[tuple[str, str | None], Command] = {
    ("dlq", "list"): _dlq_list,
    ("dlq", "show"): _dlq_show,
    ("dlq", "replay"): _dlq_replay,
    ("dlq", "purge"): _dlq_purge,
    ("trace", None): _trace,
    ("retention", None): _retention,
    ("metrics", None): cli_observe.metrics_command,
    ("queues", None): cli_observe.queues_command,
    ("doctor", None): cli_lifecycle.run_doctor,
    ("status", None): cli_lifecycle.run_status,
    **cli_outbox.COMMANDS,
    **cli_keys.COMMANDS,
    **cli_schedule.COMMANDS,
}
