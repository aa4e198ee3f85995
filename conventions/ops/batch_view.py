"""A batch as an operator reads it: ``conventions batches list|show`` and the console's
batches pages read it here.

A row of the list is a batch's counters, its callbacks' states and how long since it
last moved (a member's end, else its end or its making: :attr:`BatchStatus.last_moved`).
One batch's detail adds its nested batches and the members that are not done (failed
first, then pending), each with its name shown as every surface shows keys
(:func:`conventions.observability.shown.any_key`), its job's task id (the member's own,
:func:`conventions.batches.members.member_task_id`, while it is pending) and dead letter.
A pending member is ended by hand with :mod:`conventions.ops.batch_ends`, named by that
task id (its name may be redacted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conventions.batches.members import member_task_id
from conventions.observability import shown
from conventions.store import batches as b

#: a member's state as an operator reads it
STATES = {b.PENDING: "pending", b.SUCCEEDED: "succeeded", b.FAILED: "failed"}
#: members not done one detail lists (failed first, then pending)
MEMBERS_SHOWN = 200


def since(status: b.BatchStatus, now: datetime | None = None) -> float | None:
    """Seconds since the batch last moved (None when the store says nothing of it)."""
    moved = status.last_moved
    if moved is None:
        return None
    return max(((now or datetime.now(UTC)) - moved).total_seconds(), 0.0)


def row(status: b.BatchStatus, now: datetime | None = None) -> dict[str, Any]:
    """One batch of the list, as JSON."""
    return {**status.to_dict(), "idle_seconds": since(status, now)}


def job_of(batch_id: str, name: str, entry: tuple[str, str, str]) -> str:
    """The task id of a member's job: the run that ended it, else its own (a nested
    batch has none)."""
    if entry[1] or name.startswith(b.NESTED):
        return entry[1]
    return member_task_id(batch_id, name)


@dataclass(frozen=True)
class OpenMember:
    """A member not done, as shown: its name (redacted as keys are), state, job, dead
    letter, and its job's run state when the store has its run."""

    name: str
    state: str
    task_id: str
    dead_letter_id: str
    run_state: str | None = None

    @property
    def pending(self) -> bool:
        return self.state == STATES[b.PENDING]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "state": self.state, "task_id": self.task_id,
            "dead_letter_id": self.dead_letter_id, "run_state": self.run_state,
        }  # fmt: skip


@dataclass(frozen=True)
class Detail:
    """One batch: its status, callbacks (with their runs), nested batches and the first
    :data:`MEMBERS_SHOWN` members not done of ``open_count``."""

    batch: b.BatchStatus
    callbacks: list[dict[str, Any]]
    nested: list[str]
    open_members: list[OpenMember] = field(default_factory=list)
    open_count: int = 0

    def to_dict(self, now: datetime | None = None) -> dict[str, Any]:
        callbacks = [{k: v for k, v in c.items() if k != "run"} for c in self.callbacks]
        return {
            **row(self.batch, now), "callbacks": callbacks, "nested": self.nested,
            "open_members": [m.to_dict() for m in self.open_members],
            "open_count": self.open_count,
        }  # fmt: skip


def detail(app: Any, batch_id: str, limit: int = MEMBERS_SHOWN) -> Detail | None:
    """Batch ``batch_id`` as an operator reads it, or None."""
    store = app.store
    status = store.get_batch(batch_id)
    if status is None:
        return None
    order = {b.FAILED: 0, b.PENDING: 1}
    not_done = sorted(
        ((name, entry) for name, entry in status.members.items() if entry[0] in order),
        key=lambda item: (order[item[1][0]], item[0]),
    )
    listed = []
    for name, entry in not_done[:limit]:
        task_id = job_of(batch_id, name, entry)
        run = store.get_run(task_id) if task_id else None
        listed.append(
            OpenMember(
                shown.any_key(app, name), STATES[entry[0]], task_id, entry[2],
                str(run.state) if run is not None else None,
            )
        )  # fmt: skip
    callbacks = [
        {
            "which": which, "task": status.callbacks[which]["task"], "state": state,
            "task_id": status.callback_task_id(which),
            "run": store.get_run(status.callback_task_id(which)),
        }
        for which, state in status.callback_states.items()
    ]  # fmt: skip
    nested = [name[len(b.NESTED) :] for name in status.members if name.startswith(b.NESTED)]
    return Detail(status, callbacks, nested, listed, len(not_done))
