"""``conventions keys``: look at one idempotency key, and clear it when nothing will.

    conventions keys show KEY [--json]
    conventions keys clear KEY --reason TEXT [--actor NAME] [--json]

``show`` prints the key's enqueue reservation (which job holds it, until when) and its
ledger entry (running under a lease, or done, with its outcome). ``clear`` drops both,
whoever holds them, and records a ``key_cleared`` audit event with the actor, the reason
and what was there; it refuses to run without a reason. Find the event with
``conventions trace key:KEY``.

Clearing is the repair for what no signal reports: a queue purged (``celery purge``,
``FLUSHDB``, a deleted list) leaves each purged job's ``until_done`` reservation held for
``conventions_ledger_keep`` (7 days), and every ``.delay()`` of the key meanwhile answers
the gone job's handle. Clearing a key whose job is still waiting or running lets a
duplicate be published; the ledger still runs the body once per key, but look first.
Exit status: 0 done (``clear`` of an empty key too: nothing to do), 2 a usage error.
"""

from __future__ import annotations

import json

import click

from conventions.app import App
from conventions.cli import format as fmt
from conventions.cli.base import USAGE, Failure, Group, actor_default, command, json_option
from conventions.observability import audit
from conventions.store.base import KeyState
from conventions.tracing import headers as hdr

#: the audit event of an operator's clear
CLEARED = "key_cleared"


@click.group("keys", cls=Group)
def keys_group() -> None:
    """One idempotency key: show, clear."""


def check(reason: str, **_: object) -> None:
    """Refuse a blank reason before anything is opened (exit status 2)."""
    if not reason.strip():
        raise Failure("keys clear: --reason must not be empty", USAGE)


def trail_of(key: str) -> str:
    """The correlation id under which an operator's clears of ``key`` are recorded."""
    return f"key:{key}"


def describe(state: KeyState) -> str:
    """``state`` for a person: one line for the reservation, one for the ledger."""
    reserved = "none"
    if state.reserved_by is not None:
        until = fmt.when(state.reserved_until) if state.reserved_until else "released"
        reserved = f"held by job {fmt.shown(state.reserved_by)} until {until}"
    ledger = "none"
    if state.ledger_state is not None:
        ledger = f"{fmt.shown(state.ledger_state)} (owner {fmt.shown(state.ledger_owner)}"
        if state.ledger_outcome:
            ledger += f", outcome {fmt.shown(fmt.first_line(state.ledger_outcome))}"
        ledger += f") until {fmt.when(state.ledger_until)}"
    return f"key          {fmt.shown(state.key)}\nreservation  {reserved}\nledger       {ledger}"


KEY_HELP = "the idempotency key, e.g. receipt:ord_1"


@command("show")
@click.argument("key", metavar="KEY")
@json_option
def show_command(app: App, key: str, as_json: bool) -> int:
    """The key's reservation and ledger entry."""
    state = app.store.key_state(key)
    if as_json:
        print(json.dumps(state.to_dict(), indent=2))
    else:
        print(describe(state))
    return 0


@command("clear", before=check)
@click.argument("key", metavar="KEY")
@click.option("--reason", required=True, help="why (kept in the audit trail)")
@click.option("--actor", default=actor_default, help="who clears (default: $USER, else 'cli')")
@json_option
def clear_command(app: App, key: str, reason: str, actor: str, as_json: bool) -> int:
    """Drop the key's reservation and ledger entry (recorded in the audit trail)."""
    store = app.store
    seen = store.key_state(key)
    headers = {hdr.CORRELATION: trail_of(key), hdr.IDEMPOTENCY_KEY: key, hdr.ACTOR: actor}
    event = audit.event(
        CLEARED, "", seen.reserved_by or "", headers,
        detail={"actor": actor, "reason": reason, "reserved_by": seen.reserved_by,
                "ledger_state": seen.ledger_state, "ledger_owner": seen.ledger_owner},
    )  # fmt: skip
    cleared = store.clear_key(key, audit=event)
    if as_json:
        print(json.dumps({"cleared": cleared.to_dict(), "trail": trail_of(key)}))
        return 0
    print(describe(cleared))
    print(
        f"cleared by {fmt.shown(actor)}; audit: conventions trace {fmt.shown(trail_of(key))}"
        if not cleared.empty
        else "nothing was held: the key was free already (recorded all the same)"
    )
    return 0


for _command in (show_command, clear_command):
    keys_group.add_command(_command)
#: the commands this module adds to ``conventions``
COMMANDS = (keys_group,)
