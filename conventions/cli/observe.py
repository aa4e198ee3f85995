"""The observability commands of ``conventions``: ``metrics serve`` and ``queues``.

    conventions metrics serve [--port 9808] [--addr 127.0.0.1] [--consumers-every 15]
                              [--outbox-lag MODULE:FUNC]
    conventions queues [--json] [--watch] [--interval 2] [--count N]
    conventions queues pause NAME --reason TEXT | resume NAME   (conventions.cli.queues)

``queues`` prints one row per queue: depth (jobs waiting), the oldest waiting job's age
(counted from when it became due), its SLO; with the layer's Redis transport, the jobs
not yet due (delayed) and when the next one is, the jobs in flight and in inboxes; the
workers consuming it, and those whose sign of life is fresh; and (from the second frame
of ``--watch`` on) the rates of jobs published into it and finished out of it, from the
store's counters. It reads the broker's Redis with the group's ``--timeout`` and exits 3
when it does not answer. On RabbitMQ (``amqp://``) it reads depth and consumers with a
passive declare per queue; the oldest job's age is unknown there (``?``) and the
transport's figures are ``-`` (:class:`conventions.observability.queues.AmqpQueues`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
import redis

from conventions.cli import backends
from conventions.cli import queues as queue_actions
from conventions.cli.base import PORT, REFUSED, Failure, Group, command, options_of
from conventions.config import sentinel
from conventions.observability import queues
from conventions.ops import exporter as metrics
from conventions.ops import pauses, transport_view
from conventions.store import counts

#: the events that take a job out of its queue's work for good (the "out" rate)
FINISHED = ("succeeded", "skipped", "skipped_duplicate", "dead_lettered")


@click.group("metrics", cls=Group)
def metrics_group() -> None:
    """The Prometheus exporter."""


@command("serve")
@click.option("--port", type=PORT, default=metrics.DEFAULT_PORT, show_default=True)
@click.option(
    "--addr",
    help="address to listen on (default: conventions_metrics_addr, else 127.0.0.1; "
    "/metrics has no auth, so 0.0.0.0 only behind a network you trust)",
)
@click.option(
    "--consumers-every",
    type=float,
    default=15.0,
    metavar="SECONDS",
    help="how often to ask the workers which queues they consume (default 15)",
)
@click.option(
    "--outbox-lag",
    metavar="MODULE:FUNC",
    help="FUNC(app) returns the outbox lag in seconds (default: "
    "conventions.transactional.outbox.lag when it exists)",
)
def metrics_command(
    app: Any, port: int, addr: str | None, consumers_every: float, outbox_lag: str | None
) -> int:
    """Serve /metrics for Prometheus (until stopped)."""
    lag = metrics.load_callable(outbox_lag, app) if outbox_lag else metrics.default_outbox_lag(app)
    bind = metrics.bind_address(app, addr)
    print(f"serving metrics on http://{bind}:{port}/metrics", file=sys.stderr, flush=True)
    metrics.serve(app, port, bind, consumers_every=consumers_every, outbox_lag=lag)
    return 0


metrics_group.add_command(metrics_command)


def _broker_client(app: Any, timeout: float) -> redis.Redis | None:
    """A client of the broker's Redis with the command's timeouts (None: not Redis, and
    ``queues.from_app`` says so)."""
    given = str(app.conf.broker_url or "")
    url = given.split(";", maxsplit=1)[0]
    if sentinel.is_sentinel(given):  # the group's current primary, with the same timeouts
        options = app.conf.broker_transport_options or {}
        return sentinel.broker_client(
            given, options, socket_timeout=timeout, socket_connect_timeout=timeout
        )
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    return redis.Redis.from_url(backends.with_timeouts(url, timeout))


@command("queues")
@click.option("--json", "as_json", is_flag=True, help="print JSON (one line per frame)")
@click.option("--watch", is_flag=True, help="redraw every --interval")
@click.option("--interval", type=float, default=2.0, metavar="SECONDS", show_default=True)
@click.option("--count", type=int, default=0, metavar="N", help="stop after N frames")
def queues_command(app: Any, as_json: bool, watch: bool, interval: float, count: int) -> int:
    """Depth, oldest job, delayed, in flight, consumers and rates of every queue."""
    client = _broker_client(app, options_of(click.get_current_context()).timeout)
    try:
        reader = transport_view.broker_reader(app, client=client)
    except ValueError as exc:
        raise Failure(str(exc), REFUSED) from exc
    task_queues = metrics.queue_of_tasks(app)
    slos = metrics.slos(app, reader.queues)
    frames = count if count > 0 else (0 if watch else 1)
    previous: tuple[float, dict[str, tuple[int, int]]] | None = None
    shown = 0
    out = sys.stdout
    try:
        while True:
            states = reader.read(queues.consumers(app, timeout=1.0))
            now, flows = time.monotonic(), _flows(app.store.counters(), task_queues)
            rates = _rates(previous, (now, flows))
            previous = (now, flows)
            held = pauses.QUEUES.get_many(app.store, [state.queue for state in states])
            rows = [
                _row(state, slos, rates) | {"paused": held.get(state.queue)} for state in states
            ]
            if as_json:
                print(json.dumps(rows), file=out)
            else:
                if watch and out.isatty():
                    # the command's own escape, past the guard that escapes the records'
                    print("\x1b[H\x1b[2J", end="", file=getattr(out, "raw", out))
                print(table(rows), file=out)
            out.flush()
            shown += 1
            if frames and shown >= frames:
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        reader.close()
        if client is not None:
            client.close()


def _flows(
    counters: dict[tuple[str, str], int], task_queues: dict[str, str]
) -> dict[str, tuple[int, int]]:
    """Per queue: (jobs published into it, jobs finished out of it), all time."""
    out: dict[str, tuple[int, int]] = {}
    for (event, task), value in counts.events(counters).items():
        queue = task_queues.get(task)
        if queue is None:
            continue
        into, done = out.get(queue, (0, 0))
        if event == "published":
            into += value
        elif event in FINISHED:
            done += value
        out[queue] = (into, done)
    return out


def _rates(
    before: tuple[float, dict[str, tuple[int, int]]] | None,
    after: tuple[float, dict[str, tuple[int, int]]],
) -> dict[str, tuple[float, float]]:
    if before is None or after[0] <= before[0]:
        return {}
    elapsed = after[0] - before[0]
    out = {}
    for queue, (into, done) in after[1].items():
        was_in, was_done = before[1].get(queue, (0, 0))
        out[queue] = ((into - was_in) / elapsed, (done - was_done) / elapsed)
    return out


def _row(
    state: queues.QueueState, slos: dict[str, float], rates: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    row = state.to_dict()
    row["slo"] = slos.get(state.queue)
    in_rate, out_rate = rates.get(state.queue, (None, None))
    row["in_per_s"], row["out_per_s"] = in_rate, out_rate
    return row


def _span(seconds: float) -> str:
    """``45s``, ``12m``, ``5h``, ``7d``: the largest unit that counts two or more."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if abs(round(seconds / size)) >= 2:
            return f"{round(seconds / size)}{unit}"
    return f"{seconds:.0f}s"


def _age(seconds: float | None, source: str) -> str:
    if seconds is None:
        return "-" if source == "empty" else "?"
    text = f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"
    return f">={text}" if source == "seen" else text


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


#: the columns of ``queues``, one word each (a script may split a line on spaces)
HEADER = ("QUEUE", "DEPTH", "OLDEST", "SLO", "DELAYED", "NEXT_DUE", "IN_FLIGHT", "INBOXES",
          "CONSUMERS", "ALIVE", "IN/S", "OUT/S", "PAUSED")  # fmt: skip


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    age = _age(row["oldest_age"], row["age_source"])
    late = row["oldest_age"] is not None and row["slo"] and row["oldest_age"] > row["slo"]
    due = row.get("next_due_in")
    return (
        row["queue"],
        str(row["depth"]),
        f"{age} !" if late else age,
        f"{row['slo']:.0f}s" if row["slo"] else "-",
        _count(row.get("delayed")),
        "-" if due is None else _span(due),
        _count(row.get("in_flight")),
        _count(row.get("in_inboxes")),
        "?" if row["consumers"] is None else str(row["consumers"]),
        _count(row.get("consumers_alive")),
        _rate(row["in_per_s"]),
        _rate(row["out_per_s"]),
        "yes" if row.get("paused") else "-",
    )


def _level_cells(queue: str, level: dict[str, Any]) -> tuple[str, ...]:
    """A priority level's line under its queue's: ``email[low]``, its depth and age."""
    age = _age(level["oldest_age"], "header" if level["depth"] else "empty")
    return (f"{queue}[{level['priority']}]", str(level["depth"]), age,
            *("-" for _ in HEADER[3:]))  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The terminal table of ``queues``; an age over its SLO is marked ``!``, and a next
    due time in the past (a delayed job nobody moved yet) is negative. With priority
    steps, each level's depth and age are on a line of their own under their queue's
    (``email[low]``)."""
    lines: list[tuple[str, ...]] = [HEADER]
    for row in rows:
        lines.append(_cells(row))
        lines += [_level_cells(row["queue"], level) for level in row.get("levels") or ()]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                  enumerate(zip(line, widths, strict=True))).rstrip()
        for line in lines
    )  # fmt: skip


@click.group("queues", cls=Group, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON (one line per frame)")
@click.option("--watch", is_flag=True, help="redraw every --interval")
@click.option("--interval", type=float, default=2.0, metavar="SECONDS", show_default=True)
@click.option("--count", type=int, default=0, metavar="N", help="stop after N frames")
@click.pass_context
def queues_group(ctx: click.Context, /, **params: Any) -> None:
    """Depth, oldest job, delayed, in flight, consumers and rates of every queue; pause
    and resume one (``queues pause NAME --reason ...``, ``queues resume NAME``)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(queues_command, **params)


queues_group.add_command(queue_actions.pause_command)
queues_group.add_command(queue_actions.resume_command)

#: the commands this module adds to ``conventions``
COMMANDS = (metrics_group, queues_group)
