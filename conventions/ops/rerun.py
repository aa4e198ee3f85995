"""Re-running a job that ended, on purpose, on the record (Oban Web's "retry" of a
completed job): its payload published again under its key, with a reason and an actor.

The idempotency ledger keeps a done key for ``conventions_ledger_keep``: a new attempt
under the same key would be skipped as a duplicate (that is the guard the docs promise:
an effect that happened does not happen again by accident). So a re-run is refused,
before anything is published, while the ledger (or an enqueue reservation) holds the
key, saying so; with ``force`` (an admin's decision that running it again is safe) the
key is cleared first, in the store's own atomic step with a ``key_cleared`` audit event
naming the actor and the reason (as ``conventions keys clear`` does), and then published.

The run keeps no payload: it is rebuilt from the key when the task's key template names
every field of its payload (``"charge:{invoice_id}"``), else the operator gives it
(``--payload JSON``). The new job carries the old one's correlation id (the trace shows
both), the cause ``rerun:<old id>`` and the actor; its ``replayed`` audit event (detail
``rerun_of``) makes its run record say whose re-run it is, as a replay's does.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery.result import AsyncResult

from conventions.observability import audit
from conventions.store import keys
from conventions.store.runs import Run
from conventions.task import ConventionTask
from conventions.tracing import headers as hdr

if TYPE_CHECKING:
    from conventions.app import App

#: the states a run may be re-run from (a dead letter is replayed instead)
ENDED = ("succeeded", "skipped")


class RerunRefused(PermissionError):
    """The re-run was refused: the message says why and how to override it."""


def payload_from_key(task: ConventionTask, key: str) -> dict[str, Any] | None:
    """The payload a key template names whole, read back from ``key`` (None: the key
    does not name every required field, or does not match the template)."""
    template = getattr(task, "key", None)
    model = getattr(task, "payload", None)
    if not isinstance(template, str) or model is None:
        return None
    parts, names = [], []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            if not name.isidentifier() or name in names:
                return None
            names.append(name)
            parts.append(f"(?P<{name}>.+?)")
    found = re.fullmatch("".join(parts), key, re.DOTALL)
    if found is None:
        return None
    try:
        value = model(**found.groupdict())
    except Exception:
        return None
    return dict(value.model_dump(mode="json"))


def _checked(app: App, task_id: str) -> tuple[Run, ConventionTask]:
    run = app.store.get_run(task_id)
    if run is None:
        raise LookupError(f"no run {task_id!r} (never recorded, or past retention)")
    if run.state == "dead_lettered":
        raise RerunRefused(f"run {task_id} was dead-lettered: replay its dead letter instead")
    if run.state not in ENDED:
        raise RerunRefused(f"run {task_id} is {run.state}: only an ended job can be re-run")
    task = app.tasks.get(run.task)
    if not isinstance(task, ConventionTask):
        raise LookupError(f"run {task_id}: {run.task!r} is not a convention task of this app")
    if not run.key:
        raise LookupError(f"run {task_id} has no idempotency key recorded")
    return run, task


def rerun(
    app: App,
    task_id: str,
    *,
    reason: str,
    actor: str,
    force: bool = False,
    payload: Mapping[str, Any] | None = None,
) -> AsyncResult[Any]:
    """Publish the job of run ``task_id`` again; return the new job's handle.

    Raises ``ValueError`` for an empty reason or a payload that cannot be rebuilt,
    ``LookupError`` for an unknown run or task, ``RerunRefused`` (a ``PermissionError``)
    for a run that did not end well or a key the ledger still holds without ``force``."""
    reason = reason.strip()
    if not reason:
        raise ValueError("a re-run needs a reason (it is kept in the audit trail)")
    run, task = _checked(app, task_id)
    assert run.key is not None
    given = (
        dict(payload)
        if payload is not None
        else payload_from_key(task, keys.bare(task.name, run.key))
    )
    if given is None:
        raise ValueError(
            f"run {task_id}: its payload is not kept and its key {run.key!r} does not name "
            "all of it: give the payload (--payload JSON)"
        )
    held = keys.namespaced(task.name, run.key)
    state = app.store.key_state(held)
    headers = {hdr.CORRELATION: run.correlation_id or f"rerun:{run.id}", hdr.ACTOR: actor}
    if not state.empty and not force:
        raise RerunRefused(
            f"the ledger still holds key {held} ({state.ledger_state or 'reserved'}): a new "
            "attempt under it would be skipped as a duplicate. Check that running it again "
            "is safe, then re-run with force (it clears the key, audited)"
        )
    if force and not state.empty:
        cleared = audit.event(
            "key_cleared", task.name, run.id, {**headers, hdr.IDEMPOTENCY_KEY: held},
            detail={"actor": actor, "reason": f"re-run of {run.id}: {reason}",
                    "ledger_state": state.ledger_state, "reserved_by": state.reserved_by},
        )  # fmt: skip
        app.store.clear_key(held, audit=cleared)
    result = task.apply_async(
        kwargs=given, idempotency_key=run.key,
        headers={**headers, hdr.CAUSATION: f"rerun:{run.id}"},
    )  # fmt: skip
    if not getattr(result, "deduplicated", False):
        detail = {"actor": actor, "reason": reason, "rerun_of": run.id, "forced": force,
                  "replay_of_task_id": run.id}  # fmt: skip
        event_headers = {**headers, hdr.IDEMPOTENCY_KEY: held}
        audit.record(app.store, "replayed", task.name, str(result.id), event_headers, detail=detail)
    return result
