"""Ending a stuck batch member by hand: on purpose, on the record.

A member whose job will never end (lost before the layer could record it, or one an
operator gave up on) holds its batch pending for ever. An operator ends it as
``succeeded`` or ``failed`` with a reason (``conventions batches end``, or the console's
batch page): the store's own member-end step moves it
(:meth:`~conventions.store.base.Store.end_member`, the step a member's completion or
dead letter takes), so the batch's counters move, its parents' too when it ends, and the
callbacks that become due are published here (:func:`conventions.batches.callbacks.publish_due`;
the workers' sweep publishes any this process could not). A ``batch_member_ended`` audit
event names the actor, the reason, the member's job and the outcome, under the
correlation id ``batch:<id>`` (``conventions trace batch:<id>``).

Refused: an empty reason (``ValueError``), a batch or member that does not exist
(``LookupError``), a member that is not pending (:class:`EndRefused`). A member is named
by its name (the namespaced key, as the store keeps it) or by its job's task id (what
``batches show`` lists: a name may be redacted there).

A member ended by hand as failed has no dead letter; should its job succeed after all,
its completion moves it to succeeded, as a replay that succeeds does. One ended as
succeeded stays so whatever its job does later.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from conventions.batches.callbacks import publish_due
from conventions.observability import audit
from conventions.ops.batch_view import job_of
from conventions.store import batches as b
from conventions.tracing import headers as hdr

#: the outcomes an operator may give, by the word they type
OUTCOMES: Final = {"succeeded": b.SUCCEEDED, "failed": b.FAILED}
#: the audit event of an end by hand
EVENT: Final = "batch_member_ended"
#: the deepest batch tree walked to find a batch's parents
MAX_LEVELS: Final = 64


class EndRefused(Exception):
    """The member is not pending: nothing was changed."""


@dataclass(frozen=True)
class Ended:
    """What an end by hand did: the member, its job, the outcome, the callbacks it made
    due (``<batch id>|<callback>``) and how many of them were published."""

    batch_id: str
    member: str
    task_id: str
    outcome: str
    due: list[str]
    published: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id, "task_id": self.task_id, "outcome": self.outcome,
            "callbacks_due": self.due, "callbacks_published": self.published,
        }  # fmt: skip


def correlation(batch_id: str) -> str:
    """The correlation id of a batch's ends by hand (its story)."""
    return f"batch:{batch_id}"


def chain_of(store: Any, status: b.BatchStatus) -> tuple[str, ...]:
    """The batch and its parents, innermost first (a member's end moves them all)."""
    chain = [status.id]
    parent = status.parent
    while parent and parent not in chain and len(chain) < MAX_LEVELS:
        chain.append(parent)
        found = store.get_batch(parent, members=False)
        parent = found.parent if found is not None else None
    return tuple(chain)


def find_member(status: b.BatchStatus, member: str) -> str:
    """The member's name, from its name or its job's task id; LookupError else."""
    if member in status.members:
        return member
    for name, entry in status.members.items():
        if job_of(status.id, name, entry) == member:
            return name
    raise LookupError(f"batch {status.id!r} has no member {member!r} (give its name or its "
                      "job's task id, as batches show lists them)")  # fmt: skip


def end_member(
    app: Any, batch_id: str, member: str, *, outcome: str, reason: str, actor: str
) -> Ended:
    """End pending ``member`` of ``batch_id`` as ``outcome`` (``succeeded``, ``failed``),
    audited, and publish the callbacks that became due."""
    reason = reason.strip()
    if not reason:
        raise ValueError("ending a batch member needs a reason (it is kept in the audit trail)")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be succeeded or failed, not {outcome!r}")
    store = app.store
    status = store.get_batch(batch_id)
    if status is None:
        raise LookupError(f"no batch {batch_id!r}")
    name = find_member(status, member)
    entry = status.members[name]
    task_id = job_of(batch_id, name, entry)
    if entry[0] != b.PENDING:
        state = "succeeded" if entry[0] == b.SUCCEEDED else "failed"
        raise EndRefused(f"member {task_id or name} of batch {batch_id!r} is not pending "
                         f"(it {state}): nothing changed")  # fmt: skip
    move = b.BatchMove(chain_of(store, status), name, OUTCOMES[outcome], task_id)
    due = list(store.end_member(move))
    _audit(store, Ended(batch_id, name, task_id, outcome, due, 0), reason=reason, actor=actor)
    return Ended(batch_id, name, task_id, outcome, due, publish_due(app, due))


def _audit(store: Any, done: Ended, *, reason: str, actor: str) -> None:
    run = store.get_run(done.task_id) if done.task_id else None
    # the member's name (its key) stays out: the trail shows it as its task hides keys
    headers = {hdr.CORRELATION: correlation(done.batch_id), hdr.ACTOR: actor}
    detail = {
        "actor": actor, "reason": reason, "batch_id": done.batch_id, "outcome": done.outcome,
        "member_task_id": done.task_id, "callbacks_due": done.due,
    }  # fmt: skip
    task = run.task if run is not None else "batch"
    job = done.task_id or uuid.uuid4().hex
    audit.record(store, EVENT, task, job, headers, detail=detail)
