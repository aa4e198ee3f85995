"""``conventions outbox``: run the relay, show the outbox, create its table.

    conventions outbox relay [--url URL] [--once] [--batch N] [--poll SECONDS]
                             [--max-backoff SECONDS] [--retention DURATION]
                             [--max-attempts N]
    conventions outbox status [--url URL] [--json] [--max-lag SECONDS]
    conventions outbox dead [--url URL] [--json] [--limit N]
    conventions outbox init [--url URL]

The database is ``--url``, else the app's ``conventions_outbox_url`` setting; it is
connected with the group's ``--timeout`` (exit 3 when it does not answer).
``relay --once`` publishes what is due and exits: 0 when every due row was published,
1 when the broker was unreachable or a row failed (the rows stay, nothing is lost).
Without ``--once`` the relay runs until SIGTERM or SIGINT, finishing its batch first.
``status --max-lag S`` exits 1 when the oldest unpublished row is older than S seconds
(a health check: the relay is down, or the broker has been unreachable for that long).
``dead`` lists the rows dead-lettered after their attempts ran out (their dead letters
are in ``conventions dlq list``).

SQLAlchemy (the ``[sql]`` extra) is imported when a command runs, not with the CLI.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from conventions.app import App
from conventions.cli import backends
from conventions.cli import format as fmt
from conventions.cli.base import REFUSED, Group, Parsed, command, json_option, positive
from conventions.cli.base import print_json as _print_json
from conventions.config import durations, settings
from conventions.errors import ConfigurationError
from conventions.store import resolve_url
from conventions.transactional import (
    DEFAULT_BATCH,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BACKOFF,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_RETENTION,
)

if TYPE_CHECKING:
    import sqlalchemy as sa

DEFAULT_RETENTION_DAYS = DEFAULT_RETENTION.days
URL_HELP = "the outbox's database (default: the app's conventions_outbox_url)"


def _url_option(fun: Any) -> Any:
    return click.option("--url", help=URL_HELP)(fun)


def outbox_url(app: App, url: str | None = None, **_: Any) -> dict[str, str]:
    """The outbox's database, by name, for the unreachable message."""
    found = url or app.conf.get("conventions_outbox_url")
    return {"the outbox database": str(found)} if found else {}


def engine_for(app: App, url: str | None, timeout: float | None = None) -> sa.Engine:
    """The engine of the outbox's database: ``url``, else ``conventions_outbox_url``;
    with ``timeout``, its connections give up after that many seconds."""
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
    from conventions.store.sql import make_engine

    return make_engine(backends.with_timeouts(resolved, timeout) if timeout else resolved)


def _timeout() -> float:
    from conventions.cli.base import options_of

    return options_of(click.get_current_context()).timeout


@click.group("outbox", cls=Group)
def outbox_group() -> None:
    """The transactional outbox: relay, status, dead rows, init."""


@command("relay", extra_urls=outbox_url)
@_url_option
@click.option("--once", is_flag=True, help="publish what is due, then exit")
@click.option("--batch", type=positive(int), default=DEFAULT_BATCH, show_default=True)
@click.option(
    "--poll",
    type=positive(float),
    default=DEFAULT_POLL_INTERVAL,
    metavar="SECONDS",
    help="wait between two looks at an empty outbox",
)
@click.option(
    "--max-backoff",
    type=positive(float),
    default=DEFAULT_MAX_BACKOFF,
    metavar="SECONDS",
    help="longest wait while the broker is unreachable",
)
@click.option(
    "--retention",
    type=Parsed(durations.parse_duration, "DURATION"),
    default=f"{DEFAULT_RETENTION_DAYS}d",
    metavar="DURATION",
    help=f"keep published rows this long (default {DEFAULT_RETENTION_DAYS}d)",
)
@click.option(
    "--max-attempts",
    type=positive(int),
    metavar="N",
    help="dead-letter a row failing for its own reason after N attempts (default: "
    f"conventions_outbox_max_attempts, else {DEFAULT_MAX_ATTEMPTS})",
)
def relay_command(
    app: App,
    *,
    url: str | None,
    once: bool,
    batch: int,
    poll: float,
    max_backoff: float,
    retention: timedelta,
    max_attempts: int | None,
) -> int:
    """Publish committed outbox rows (long-running; --once: what is due, then exit)."""
    from conventions.tracing import logs
    from conventions.transactional import relay as relaylib

    handler = logging.StreamHandler()  # stderr, in the workers' format (text or JSON)
    handler.setFormatter(logs.formatter(str(app.conf.get("conventions_log_format") or "text")))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    engine = engine_for(app, url, _timeout())
    relay = relaylib.Relay(app, engine, batch=batch, retention=retention, max_attempts=max_attempts)
    try:
        if once:
            result = relay.drain()
            relay.release()
            locked = " (another relay holds the lease)" if result.locked_out else ""
            dead = f" ({result.dead} dead-lettered)" if result.dead else ""
            newer = f", {result.newer} left for a newer release" if result.newer else ""
            print(
                f"published {result.published} ({result.deduplicated} deduplicated), "
                f"failed {result.failed}{dead}{newer}{locked}",
            )
            if result.unavailable:
                print(f"conventions: broker unavailable: {result.unavailable}", file=sys.stderr)
            return REFUSED if result.unavailable or result.failed else 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        print(f"relay {relay.owner} publishing from {engine.url!r}", flush=True)
        relay.run(stop, poll_interval=poll, max_backoff=max_backoff)
        return 0
    finally:
        engine.dispose()


@command("status", extra_urls=outbox_url)
@_url_option
@json_option
@click.option(
    "--max-lag",
    type=positive(float),
    metavar="SECONDS",
    help="exit 1 when the oldest unpublished row is older than this",
)
def status_command(app: App, url: str | None, as_json: bool, max_lag: float | None) -> int:
    """Pending rows, failures and the outbox lag."""
    from conventions.transactional import outbox

    engine = engine_for(app, url, _timeout())
    try:
        outbox.create_table(engine)
        state = outbox.status(engine)
    finally:
        engine.dispose()
    if as_json:
        _print_json(state.to_dict())
    else:
        print(
            f"pending {state.pending} (failing {state.failing}), published kept "
            f"{state.published}, lag {state.lag:.1f}s, dead {state.dead}"
        )
        if state.last_error:
            print(f"last error: {fmt.shown(state.last_error)}")
    if max_lag is not None and state.lag > max_lag:
        print(f"conventions: outbox lag {state.lag:.0f}s is above {max_lag:.0f}s", file=sys.stderr)
        return REFUSED
    return 0


@command("dead", extra_urls=outbox_url)
@_url_option
@json_option
@click.option("--limit", type=positive(int), default=100, metavar="N", show_default=True)
def dead_command(app: App, url: str | None, as_json: bool, limit: int) -> int:
    """Rows dead-lettered after their attempts ran out."""
    from conventions.transactional import outbox

    engine = engine_for(app, url, _timeout())
    try:
        outbox.create_table(engine)
        rows = outbox.dead_rows(engine, limit)
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
    if as_json:
        _print_json(shown)
        return 0
    for row in shown:
        print(
            f"{row['failed_at']}  {fmt.shown(row['task'])}[{fmt.shown(row['task_id'])}] "
            f"{fmt.shown(row['idempotency_key'])}  after {row['attempts']} attempts: "
            f"{fmt.shown(row['last_error'])}"
        )
    print(f"{len(shown)} dead-lettered rows (their dead letters: conventions dlq list)")
    return 0


@command("init", extra_urls=outbox_url)
@_url_option
def init_command(app: App, url: str | None) -> int:
    """Create the outbox table (idempotent)."""
    from conventions.transactional import outbox

    engine = engine_for(app, url, _timeout())
    try:
        outbox.create_table(engine)
    finally:
        engine.dispose()
    print(f"outbox table {outbox.TABLE} ready")
    return 0


for _command in (relay_command, status_command, dead_command, init_command):
    outbox_group.add_command(_command)
#: the commands this module adds to ``conventions``
COMMANDS = (outbox_group,)
