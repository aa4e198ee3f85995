"""``conventions batches``: see a stuck batch, and end its stuck member by hand.

    conventions batches list [--pending] [--limit N] [--json]
    conventions batches show ID [--limit N] [--json]
    conventions batches end ID MEMBER --outcome failed|succeeded --reason TEXT [--actor NAME]

``list`` prints the newest batches: counters, callbacks' states and how long since each
last moved (``--pending``: only the batches not ended). ``show`` prints one batch: its
counters, callbacks, nested batches and the members not done (failed first), each with
its name shown as every surface shows keys, its state, its job's task id and its dead
letter (``conventions.ops.batch_view``). ``end`` ends a pending member by hand through
the store's member-end step, audited with the actor and the reason, and publishes the
callbacks that became due (``conventions.ops.batch_ends``); MEMBER is the member's job
task id as ``show`` lists it, or its name. Exit status: 0 done, 1 no such batch or
member, or a member that is not pending, 2 a usage error (an empty reason).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click

from conventions.app import App
from conventions.cli import format as fmt
from conventions.cli.base import (
    REFUSED,
    USAGE,
    Failure,
    Group,
    actor_default,
    command,
    json_option,
    positive,
    print_json,
)
from conventions.ops import batch_ends, batch_view
from conventions.store.batches import BatchStatus

#: batches the store is asked for when ``--pending`` filters them
SCANNED = 1000


@click.group("batches", cls=Group)
def batches_group() -> None:
    """Batches: list, show, end a stuck member by hand."""


def idle(seconds: float | None) -> str:
    """How long since a batch moved, in the largest unit that fits."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _callbacks(status: BatchStatus) -> str:
    return " ".join(f"{which}={state}" for which, state in status.callback_states.items()) or "-"


@command("list")
@click.option("--pending", "only_pending", is_flag=True, help="only the batches not ended")
@click.option("--limit", type=positive(int), default=50, show_default=True, metavar="N")
@json_option
def list_(app: App, only_pending: bool, limit: int, as_json: bool) -> int:
    """The newest batches, with how long since each last moved."""
    found = app.store.list_batches(SCANNED if only_pending else limit)
    listed = [s for s in found if not (only_pending and s.ended)][:limit]
    now = datetime.now(UTC)
    if as_json:
        print_json([batch_view.row(status, now) for status in listed])
        return 0
    if not listed:
        print("no pending batches" if only_pending else "no batches", file=sys.stderr)
        return 0
    rows = [
        (s.id, fmt.when(s.created_at), s.total, s.succeeded, s.failed, s.pending,
         _callbacks(s), idle(batch_view.since(s, now)))
        for s in listed
    ]  # fmt: skip
    headers = ("ID", "CREATED", "TOTAL", "OK", "FAILED", "PENDING", "CALLBACKS", "MOVED")
    print(fmt.table(headers, rows))
    return 0


@command("show")
@click.argument("batch_id", metavar="ID")
@click.option(
    "--limit", type=positive(int), default=batch_view.MEMBERS_SHOWN, show_default=True,
    metavar="N", help="members not done to list",
)  # fmt: skip
@json_option
def show(app: App, batch_id: str, limit: int, as_json: bool) -> int:
    """One batch: counters, callbacks, nested batches, the members not done."""
    found = batch_view.detail(app, batch_id, limit)
    if found is None:
        raise Failure(f"no batch {batch_id!r}", REFUSED)
    if as_json:
        print_json(found.to_dict())
        return 0
    s = found.batch
    print(f"batch {fmt.shown(s.id)}" + (f" (in {fmt.shown(s.parent)})" if s.parent else ""))
    print(f"  members {s.total}: {s.succeeded} succeeded, {s.failed} failed, {s.pending} pending")
    print(f"  created {fmt.when(s.created_at)}, "
          + (f"ended {fmt.when(s.ended_at)}" if s.ended_at else "not ended")
          + f", last moved {idle(batch_view.since(s))} ago")  # fmt: skip
    for c in found.callbacks:
        run = c["run"]
        print(f"  {c['which']} {c['task']}: {c['state']} (job {c['task_id']}"
              + (f", {run.state})" if run is not None else ")"))  # fmt: skip
    for nested in found.nested:
        print(f"  nested batch {fmt.shown(nested)}")
    if found.open_members:
        print(f"members not done ({found.open_count}):")
        rows = [
            (m.name, m.state, m.task_id or "-", m.run_state or "-",
             m.dead_letter_id or "-")
            for m in found.open_members
        ]  # fmt: skip
        print(fmt.table(("MEMBER", "STATE", "JOB", "JOB STATE", "DEAD LETTER"), rows))
        if found.open_count > len(found.open_members):
            print(f"the first {len(found.open_members)} of {found.open_count} (--limit)")
    return 0


def check_end(reason: str, **_: object) -> None:
    if not reason.strip():
        raise Failure("batches end: --reason must not be empty", USAGE)


@command("end", before=check_end)
@click.argument("batch_id", metavar="ID")
@click.argument("member", metavar="MEMBER")
@click.option(
    "--outcome", required=True, type=click.Choice(sorted(batch_ends.OUTCOMES)),
    help="how the member ends: failed (on_success will not run) or succeeded",
)  # fmt: skip
@click.option("--reason", required=True, help="why (kept in the audit trail)")
@click.option("--actor", default=actor_default, help="who ends it (default: $USER, else 'cli')")
@json_option
def end(
    app: App, *, batch_id: str, member: str, outcome: str, reason: str, actor: str, as_json: bool
) -> int:
    """End a pending member by hand (audited); the callbacks it makes due are published."""
    try:
        done = batch_ends.end_member(
            app, batch_id, member, outcome=outcome, reason=reason, actor=actor
        )
    except (LookupError, batch_ends.EndRefused) as exc:
        raise Failure(str(exc), REFUSED) from exc
    if as_json:
        print_json(done.to_dict())
        return 0
    print(f"member {done.task_id or fmt.shown(member)} of batch {fmt.shown(batch_id)} ended "
          f"as {outcome} by {actor}")  # fmt: skip
    for item in done.due:
        print(f"callback due: {fmt.shown(item)}")
    if len(done.due) > done.published:
        print(f"{len(done.due) - done.published} callback(s) not published now: the workers' "
              "sweep publishes them", file=sys.stderr)  # fmt: skip
    return 0


for _command in (list_, show, end):
    batches_group.add_command(_command)
#: the commands this module adds to ``conventions``
COMMANDS = (batches_group,)
