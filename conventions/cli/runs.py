"""``conventions runs``: the run history, one record per job.

    conventions runs list [--task T] [--state S] [--key K] [--correlation C] [--queue Q]
                          [--since WHEN] [--limit N] [--json]
    conventions runs show TASK_ID [--json]
    conventions runs rerun TASK_ID --reason TEXT [--force] [--payload JSON] [--actor NAME]

``list`` prints the newest runs first (by when they were queued), filtered; ``show`` one
run whole: its fields, each attempt (worker, start, end, outcome, scrubbed error) and,
for a job that keeps them (``conventions.observability.runs.keep_logs``), its log lines.
``--key`` takes the key in either form: as the body sees it (``charge:inv_4004``) or as
the store and dead letters keep it (``billing.charge_invoice:charge:inv_4004``); ``show``
prints both.
``rerun`` publishes an ended job again on purpose (``conventions.ops.rerun``): refused
while the ledger still holds its key (the new attempt would be skipped as a duplicate),
unless ``--force`` clears the key first (audited with the actor and the reason).
Exit status: 0 done, 1 no such run or a refused re-run, 2 a usage error.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

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
    print_json,
)
from conventions.config import durations
from conventions.observability import shown
from conventions.ops import rerun as rerunlib
from conventions.store import key_forms
from conventions.store.runs import STATES, Run

SINCE = Parsed(durations.parse_since, "WHEN")


@click.group("runs", cls=Group)
def runs_group() -> None:
    """The run history: list, show, rerun."""


def runs_table(found: list[Run]) -> str:
    rows = [
        (
            run.id, run.task, run.state, fmt.when(run.created_at), str(len(run.attempts)),
            run.queue or "-", run.key or "-",
        )
        for run in found
    ]  # fmt: skip
    return fmt.table(("ID", "TASK", "STATE", "QUEUED", "ATTEMPTS", "QUEUE", "KEY"), rows)


def run_detail(run: Run) -> str:
    fields = [
        ("id", run.id), ("task", run.task), ("version", run.version), ("state", run.state),
        ("queued", fmt.when(run.created_at)), ("updated", fmt.when(run.updated_at)),
        ("ended", fmt.when(run.ended_at) if run.ended_at else "-"), ("queue", run.queue),
        ("key", run.key), ("store key", key_forms.both(run.task, run.key)[1] if run.key else None),
        ("correlation", run.correlation_id), ("causation", run.causation_id),
        ("actor", run.actor), ("category", run.category), ("dead letter", run.dead_letter_id),
        ("replay of", run.replay_of), ("replayed by", run.replayed_by),
    ]  # fmt: skip
    lines = [f"{name:<12} {fmt.shown(value)}" for name, value in fields if value]
    lines.append("attempts")
    for attempt in run.attempts:
        start = fmt.when(attempt.started_at) if attempt.started_at else "-"
        end = fmt.when(attempt.ended_at) if attempt.ended_at else "-"
        lines.append(
            f"  #{attempt.n} {fmt.shown(attempt.outcome or 'running')} on "
            f"{fmt.shown(attempt.worker or '-')} "
            f"from {start} to {end}"
        )
        if attempt.error:
            lines.append(f"     error: {fmt.shown(fmt.first_line(attempt.error))}")
    if run.logs:
        lines.append("logs")
        lines.extend(f"  {fmt.shown(line)}" for line in run.logs)
    return "\n".join(lines)


@command("list")
@click.option("--task", help="the task name, e.g. email.send_receipt.v1")
@click.option("--state", type=click.Choice(STATES), help="the run's state")
@click.option(
    "--key", help="the idempotency key, either form: as the body sees it or as the store keeps it"
)
@click.option("--correlation", help="the correlation id")
@click.option("--queue", help="the queue it was delivered from")
@click.option("--since", type=SINCE, help="queued since: 2h, 3d, or an ISO 8601 time")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
def list_command(  # noqa: PLR0917
    app: App,
    task: str | None,
    state: str | None,
    key: str | None,
    correlation: str | None,
    queue: str | None,
    since: datetime | None,
    limit: int,
    as_json: bool,
) -> int:
    """The newest runs first, filtered."""
    found = key_forms.list_runs(
        app.store, key_forms.job_names(app), key, task=task, state=state,
        correlation_id=correlation, queue=queue, since=since, limit=limit,
    )  # fmt: skip
    found = [shown.run(app, run) for run in found]
    if as_json:
        print_json([run.to_dict() for run in found])
    elif found:
        print(runs_table(found))
    else:
        print("no runs")
    return 0


@command("show")
@click.argument("task_id", metavar="TASK_ID")
@json_option
def show_command(app: App, task_id: str, as_json: bool) -> int:
    """One run: its fields, attempts and logs."""
    run = app.store.get_run(task_id)
    if run is None:
        raise Failure(f"no run {task_id} (never recorded, or past retention)", REFUSED)
    run = shown.run(app, run)  # its key, errors and logs scrubbed as the console shows them
    if as_json:
        print_json(run.to_dict())
    else:
        print(run_detail(run))
    return 0


def check_rerun(reason: str, payload: str | None, **_: object) -> None:
    """Refuse a blank reason or a payload that is not a JSON object, before the app."""
    if not reason.strip():
        raise Failure("runs rerun: --reason must not be empty", USAGE)
    if payload is not None:
        try:
            ok = isinstance(json.loads(payload), dict)
        except RecursionError:  # nested deeper than the parser goes
            raise Failure("runs rerun: --payload is nested too deep", USAGE) from None
        except ValueError:
            ok = False
        if not ok:
            raise Failure("runs rerun: --payload must be a JSON object", USAGE)


@command("rerun", before=check_rerun)
@click.argument("task_id", metavar="TASK_ID")
@click.option("--reason", required=True, help="why (kept in the audit trail)")
@click.option("--force", is_flag=True, help="clear the key the ledger holds (audited), then run")
@click.option("--payload", help="the payload as JSON, when its key does not name all of it")
@click.option("--actor", default=actor_default, help="who re-runs (default: $USER, else 'cli')")
@json_option
def rerun_command(  # noqa: PLR0917
    app: App, task_id: str, reason: str, force: bool, payload: str | None, actor: str,
    as_json: bool,
) -> int:  # fmt: skip
    """Run an ended job again, on purpose (refused while the ledger holds its key)."""
    given: dict[str, Any] | None = json.loads(payload) if payload is not None else None
    try:
        result = rerunlib.rerun(
            app, task_id, reason=reason, actor=actor, force=force, payload=given
        )
    except (PermissionError, LookupError, ValueError) as exc:
        raise Failure(str(exc), REFUSED) from exc
    deduplicated = bool(getattr(result, "deduplicated", False))
    if as_json:
        print_json({"rerun_of": task_id, "task_id": str(result.id), "deduplicated": deduplicated})
    elif deduplicated:
        print(f"not published: its key is held by job {result.id}")
    else:
        print(f"re-run of {task_id} published as job {result.id} (by {actor})")
    return REFUSED if deduplicated else 0


for _command in (list_command, show_command, rerun_command):
    runs_group.add_command(_command)
#: the commands this module adds to ``conventions``
COMMANDS = (runs_group,)
