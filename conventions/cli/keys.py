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

import argparse
import json
import os
from collections.abc import Callable
from typing import Any, TextIO

from conventions.app import App
from conventions.cli import format as fmt
from conventions.observability import audit
from conventions.store.base import KeyState
from conventions.tracing import headers as hdr

#: the audit event of an operator's clear
CLEARED = "key_cleared"


def add_parser(commands: Any) -> None:
    """Add ``keys show|clear`` to the ``conventions`` command."""
    parser = commands.add_parser("keys", help="one idempotency key: show, clear")
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    show = actions.add_parser("show", help="the key's reservation and ledger entry")
    show.add_argument("key", metavar="KEY", help="the idempotency key, e.g. receipt:ord_1")
    show.add_argument("--json", action="store_true", help="print JSON")

    clear = actions.add_parser("clear", help="drop the key's reservation and ledger entry")
    clear.add_argument("key", metavar="KEY", help="the idempotency key, e.g. receipt:ord_1")
    clear.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    clear.add_argument(
        "--actor",
        default=os.environ.get("USER") or "cli",
        help="who clears (default: $USER, else 'cli')",
    )
    clear.add_argument("--json", action="store_true", help="print JSON")
    clear.set_defaults(usage_error=clear.error)


def check(args: argparse.Namespace) -> None:
    """Refuse a blank reason before anything is opened (exit status 2)."""
    if args.command == "keys" and args.keys_command == "clear" and not args.reason.strip():
        args.usage_error("--reason must not be empty")


def trail_of(key: str) -> str:
    """The correlation id under which an operator's clears of ``key`` are recorded."""
    return f"key:{key}"


def describe(state: KeyState) -> str:
    """``state`` for a person: one line for the reservation, one for the ledger."""
    reserved = "none"
    if state.reserved_by is not None:
        until = fmt.when(state.reserved_until) if state.reserved_until else "released"
        reserved = f"held by job {state.reserved_by} until {until}"
    ledger = "none"
    if state.ledger_state is not None:
        ledger = f"{state.ledger_state} (owner {state.ledger_owner}"
        if state.ledger_outcome:
            ledger += f", outcome {fmt.first_line(state.ledger_outcome)}"
        ledger += f") until {fmt.when(state.ledger_until)}"
    return f"key          {state.key}\nreservation  {reserved}\nledger       {ledger}"


def _show(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    state = app.store.key_state(args.key)
    if args.json:
        print(json.dumps(state.to_dict(), indent=2), file=out)
    else:
        print(describe(state), file=out)
    return 0


def _clear(app: App, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    check(args)
    store = app.store
    seen = store.key_state(args.key)
    headers = {hdr.CORRELATION: trail_of(args.key), hdr.IDEMPOTENCY_KEY: args.key,
               hdr.ACTOR: args.actor}  # fmt: skip
    event = audit.event(
        CLEARED, "", seen.reserved_by or "", headers,
        detail={"actor": args.actor, "reason": args.reason, "reserved_by": seen.reserved_by,
                "ledger_state": seen.ledger_state, "ledger_owner": seen.ledger_owner},
    )  # fmt: skip
    cleared = store.clear_key(args.key, audit=event)
    if args.json:
        print(json.dumps({"cleared": cleared.to_dict(), "trail": trail_of(args.key)}), file=out)
        return 0
    print(describe(cleared), file=out)
    print(
        f"cleared by {args.actor}; audit: conventions trace {trail_of(args.key)}"
        if not cleared.empty
        else "nothing was held: the key was free already (recorded all the same)",
        file=out,
    )
    return 0


Command = Callable[[App, argparse.Namespace, TextIO, TextIO], int]
COMMANDS: dict[tuple[str, str | None], Command] = {
    ("keys", "show"): _show,
    ("keys", "clear"): _clear,
}
