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
KEY is either form: as the body sees it (``charge:inv_4004``) or as the store keeps it,
under the task's namespace (``billing.charge_invoice:charge:inv_4004``, as dead letters
show it). A bare key is looked for as typed and under each job's namespace; both forms
are printed. Exit status: 0 done (``clear`` of an empty key too: nothing to do), 1
``show`` found nothing held (it says which keys it looked for), 2 a usage error (a bare
key held under two jobs' namespaces: name one).
"""

from __future__ import annotations

import json
from dataclasses import replace

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
)
from conventions.observability import audit, shown
from conventions.store import key_forms
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


def resolve(app: App, key: str) -> tuple[KeyState, list[str]]:
    """What the store holds for ``key`` in whichever form holds something (as typed,
    then under each job's namespace), and the store keys looked at. Nothing held: the
    empty state of the key as typed."""
    forms = key_forms.store_forms(key, key_forms.job_names(app))
    held = [state for state in map(app.store.key_state, forms) if not state.empty]
    if len(held) > 1:
        raise Failure(
            f"keys: {key!r} is held under {len(held)} jobs' namespaces "
            f"({', '.join(state.key for state in held)}): name one",
            USAGE,
        )
    return (held[0] if held else app.store.key_state(forms[0])), forms


def body_key(app: App, stored: str) -> str | None:
    """``stored`` as the body sees it, when it carries a job's namespace."""
    spaces = key_forms.carried(stored, key_forms.job_names(app))
    return stored[len(spaces[0]) + 1 :] if spaces else None


def describe(state: KeyState, bare: str | None = None) -> str:
    """``state`` for a person: the key in both forms (``bare``: as the body sees it),
    one line for the reservation, one for the ledger."""
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
    stored = fmt.shown(state.key)
    key = (
        f"key          {fmt.shown(bare)}\nstore key    {stored}"
        if bare
        else f"key          {stored}"
    )
    return f"{key}\nreservation  {reserved}\nledger       {ledger}"


def _redacted(app: App, state: KeyState, forms: list[str]) -> list[str]:
    """``forms`` of a key as an operator is shown them (a sensitive field redacted)."""
    return [shown.key_state(app, replace(state, key=form)).key for form in forms]


KEY_HELP = "the idempotency key, either form: receipt:ord_1 or email.send_receipt:receipt:ord_1"


@command("show")
@click.argument("key", metavar="KEY")
@json_option
def show_command(app: App, key: str, as_json: bool) -> int:
    """The key's reservation and ledger entry (KEY: either form)."""
    state, looked = resolve(app, key)
    state = shown.key_state(app, state)  # sensitive fields redacted, as the console shows
    bare = body_key(app, state.key)
    if as_json:
        # what was looked for is said on a miss only (it repeats the key as typed)
        missed = {"looked_for": _redacted(app, state, looked)} if state.empty else {}
        print(json.dumps({**state.to_dict(), "body_key": bare, **missed}, indent=2))
        return REFUSED if state.empty else 0
    if state.empty:
        typed = shown.key_state(app, replace(state, key=key)).key
        tried = ", ".join(_redacted(app, state, looked))
        raise Failure(f"keys show: nothing held for {typed!r} (looked for {tried})", REFUSED)
    print(describe(state, bare))
    return 0


@command("clear", before=check)
@click.argument("key", metavar="KEY")
@click.option("--reason", required=True, help="why (kept in the audit trail)")
@click.option("--actor", default=actor_default, help="who clears (default: $USER, else 'cli')")
@json_option
def clear_command(app: App, key: str, reason: str, actor: str, as_json: bool) -> int:
    """Drop the key's reservation and ledger entry (recorded in the audit trail)."""
    store = app.store
    seen, _ = resolve(app, key)
    key = seen.key  # the form that holds something (else the key as typed)
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
    print(describe(cleared, body_key(app, cleared.key)))
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
