"""``conventions outbox``: run the relay, show the outbox, create its table.

    conventions outbox relay [--url URL] [--once] [--batch N] [--poll SECONDS]
                             [--max-backoff SECONDS] [--retention DURATION]
                             [--max-attempts N]
    conventions outbox status [--url URL] [--json] [--max-lag SECONDS]
    conventions outbox dead [--url URL] [--json] [--limit N]
    conventions outbox init [--url URL]

The database is ``--url``, else the app's ``conventions_outbox_url`` setting.
``relay --once`` publishes what is due and exits: 0 when every due row was published,
1 when the broker was unreachable or a row failed (the rows stay, nothing is lost).
Without ``--once`` the relay runs until SIGTERM or SIGINT, finishing its batch first.
``status --max-lag S`` exits 1 when the oldest unpublished row is older than S seconds
(a health check: the relay is down, or the broker has been unreachable for that long).
``dead`` lists the rows dead-lettered after their attempts ran out (their dead letters
are in ``conventions dlq list``).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any, TextIO

import sqlalchemy as sa

from conventions.app import App
from conventions.cli import format as fmt
from conventions.config import settings
from conventions.errors import ConfigurationError
from conventions.store import resolve_url
from conventions.store.sql import make_engine
from conventions.tracing import logs
from conventions.transactional import outbox
from conventions.transactional import relay as relaylib


def _number(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    convert.__name__ = parse.__name__
    return convert


def _duration(text: str) -> Any:
    try:
        return fmt.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(commands: Any) -> None:
    """Add ``outbox relay|status|init`` to the ``conventions`` command."""
    parser = commands.add_parser("outbox", help="the transactional outbox: relay, status")
    actions = parser.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    url_help = "the outbox's database (default: the app's conventions_outbox_url)"

    run = actions.add_parser("relay", help="publish committed outbox rows (long-running)")
    run.add_argument("--url", help=url_help)
    run.add_argument("--once", action="store_true", help="publish what is due, then exit")
    run.add_argument("--batch", type=_number(int), default=relaylib.DEFAULT_BATCH)
    run.add_argument(
        "--poll",
        type=_number(float),
        default=relaylib.DEFAULT_POLL_INTERVAL,
        metavar="SECONDS",
        help="wait between two looks at an empty outbox",
    )
    run.add_argument(
        "--max-backoff",
        type=_number(float),
        default=relaylib.DEFAULT_MAX_BACKOFF,
        metavar="SECONDS",
        help="longest wait while the broker is unreachable",
    )
    run.add_argument(
        "--retention",
        type=_duration,
        default=relaylib.DEFAULT_RETENTION,
        metavar="DURATION",
        help=f"keep published rows this long (default {relaylib.DEFAULT_RETENTION.days}d)",
    )
    run.add_argument(
        "--max-attempts",
        type=_number(int),
        metavar="N",
        help="dead-letter a row failing for its own reason after N attempts (default: "
        f"conventions_outbox_max_attempts, else {relaylib.DEFAULT_MAX_ATTEMPTS})",
    )

    show = actions.add_parser("status", help="pending rows, failures and the outbox lag")
    show.add_argument("--url", help=url_help)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument(
        "--max-lag",
        type=_number(float),
        metavar="SECONDS",
        help="exit 1 when the oldest unpublished row is older than this",
    )

    dead = actions.add_parser("dead", help="rows dead-lettered after their attempts")
    dead.add_argument("--url", help=url_help)
    dead.add_argument("--json", action="store_true", help="print JSON")
    dead.add_argument("--limit", type=_number(int), default=100, metavar="N")

    init = actions.add_parser("init", help="create the outbox table (idempotent)")
    init.add_argument("--url", help=url_help)


def engine_for(app: App, url: str | None) -> sa.Engine:
    """The engine of the outbox's database: ``url``, else ``conventions_outbox_url``."""
    url = url or app.conf.get("conventions_outbox_url")
    if not url:
        raise ConfigurationError(
            "no outbox database: pass --url or set conventions_outbox_url in celeryconfig.py "
            "(the web app's database, where outbox.add writes)"
        )
    try:
        backend, resolved = resolve_url(str(url))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    if backend != "sql":
        raise ConfigurationError(
            f"the outbox lives in a SQL database, not {settings.mask_url(str(url))!r}"
        )
    return make_engine(resolved)


def _relay(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    handler = logging.StreamHandler()  # stderr, in the workers' format (text or JSON)
    handler.setFormatter(logs.formatter(str(app.conf.get("conventions_log_format") or "text")))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    engine = engine_for(app, args.url)
    relay = relaylib.Relay(
        app, engine, batch=args.batch, retention=args.retention, max_attempts=args.max_attempts
    )
    try:
        if args.once:
            result = relay.drain()
            relay.release()
            locked = " (another relay holds the lease)" if result.locked_out else ""
            dead = f" ({result.dead} dead-lettered)" if result.dead else ""
            print(
                f"published {result.published} ({result.deduplicated} deduplicated), "
                f"failed {result.failed}{dead}{locked}",
                file=out,
            )
            if result.unavailable:
                print(f"conventions: broker unavailable: {result.unavailable}", file=err)
            return 1 if result.unavailable or result.failed else 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        print(f"relay {relay.owner} publishing from {engine.url!r}", file=out, flush=True)
        relay.run(stop, poll_interval=args.poll, max_backoff=args.max_backoff)
        return 0
    finally:
        engine.dispose()


def _status(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    engine = engine_for(app, args.url)
    try:
        outbox.create_table(engine)
        state = outbox.status(engine)
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps(state.to_dict(), indent=2), file=out)
    else:
        print(
            f"pending {state.pending} (failing {state.failing}), published kept "
            f"{state.published}, lag {state.lag:.1f}s, dead {state.dead}",
            file=out,
        )
        if state.last_error:
            print(f"last error: {state.last_error}", file=out)
    if args.max_lag is not None and state.lag > args.max_lag:
        print(f"conventions: outbox lag {state.lag:.0f}s is above {args.max_lag:.0f}s", file=err)
        return 1
    return 0


def _dead(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    engine = engine_for(app, args.url)
    try:
        outbox.create_table(engine)
        rows = outbox.dead_rows(engine, args.limit)
    finally:
        engine.dispose()
    shown = [
        {
            "id": row.id, "task_id": row.task_id, "task": row.task,
            "idempotency_key": row.idempotency_key, "attempts": row.attempts,
            "created_at": row.created_at.isoformat(), "failed_at": row.failed_at.isoformat(),
            "last_error": row.last_error,
        }
        for row in rows
    ]  # fmt: skip
    if args.json:
        print(json.dumps(shown, indent=2), file=out)
        return 0
    for row in shown:
        print(
            f"{row['failed_at']}  {row['task']}[{row['task_id']}] {row['idempotency_key']}  "
            f"after {row['attempts']} attempts: {row['last_error']}",
            file=out,
        )
    print(f"{len(shown)} dead-lettered rows (their dead letters: conventions dlq list)", file=out)
    return 0


def _init(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    engine = engine_for(app, args.url)
    try:
        outbox.create_table(engine)
    finally:
        engine.dispose()
    print(f"outbox table {outbox.TABLE} ready", file=out)
    return 0


Command = Callable[[App, argparse.Namespace, TextIO, TextIO], int]
COMMANDS: dict[tuple[str, str | None], Command] = {
    ("outbox", "relay"): _relay,
    ("outbox", "status"): _status,
    ("outbox", "dead"): _dead,
    ("outbox", "init"): _init,
}
