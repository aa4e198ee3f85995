"""A batch's records in the store: what both backends keep and hand back.

A batch (:mod:`conventions.batches.declare`) is N member jobs and up to two callbacks. The
store keeps, per batch, its counters (``pending``, ``succeeded``, ``failed``), each
member's state and the state of each callback; per member, one of :data:`PENDING`,
:data:`SUCCEEDED` or :data:`FAILED` (dead-lettered). A member's state moves in the same
script (Redis) or transaction (SQL) as the member's own completion or dead letter, and
the batch's counters with it (:class:`BatchMove`), so there is no moment when a job is
done and its batch does not know it. The moves are:

* pending -> succeeded or failed: the member ended;
* failed -> succeeded: a dead-lettered member was replayed and succeeded;
* anything else changes nothing (a second completion of the same member, a late
  failure of a copy after a success): the counters move once per member and outcome.

When a move brings ``pending`` to 0 the batch has ended: its ``on_complete`` callback
becomes due, and its ``on_success`` too when no member failed (or later, when the last
failed member is replayed and succeeds). A callback that becomes due is recorded so in
the same step, with the time, and whoever made it due publishes it next and marks it
sent; a sweep publishes again the ones left due past a grace period (a crash between
the two). An ended batch that is itself a member of a parent batch moves its member
entry in the parent (succeeded when none of its own members failed) in the same step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

#: a member's state: not ended yet
PENDING: Final = "p"
#: a member's state: succeeded (or skipped: ended without a dead letter)
SUCCEEDED: Final = "s"
#: a member's state: dead-lettered (until a replay succeeds)
FAILED: Final = "f"
#: the member name of a nested batch in its parent
NESTED: Final = "batch:"
#: the two callbacks
ON_SUCCESS: Final = "on_success"
ON_COMPLETE: Final = "on_complete"
CALLBACKS: Final = (ON_SUCCESS, ON_COMPLETE)
#: a callback's state: none declared / waiting for the batch / due (to publish) / sent
NO_CALLBACK: Final = "none"
WAITING: Final = "waiting"
DUE: Final = "due"
SENT: Final = "sent"


def nested_member(batch_id: str) -> str:
    """The member name of batch ``batch_id`` in its parent."""
    return f"{NESTED}{batch_id}"


@dataclass(frozen=True)
class BatchSpec:
    """What a batch is made with (``create_batch``): its id, its members and callbacks."""

    id: str
    #: the member names: each member job's namespaced idempotency key, or
    #: :func:`nested_member` of a nested batch
    members: tuple[str, ...]
    #: the callbacks' signatures (Celery's dict form: ``task``, ``kwargs``), by name
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the batch this one is a member of
    parent: str | None = None
    #: the outermost batch of its tree, when it is nested (on Redis Cluster, a tree's
    #: keys are in its root's slot)
    root: str | None = None

    def document(self) -> str:
        """The JSON the store keeps of it (callbacks and parent)."""
        return json.dumps({"callbacks": self.callbacks, "parent": self.parent})


@dataclass(frozen=True)
class BatchMove:
    """A member's end, moved with the job's completion or dead letter."""

    #: the batch ids, innermost first: a job's own batch, then its parent and so on (the
    #: parents are moved only when the batch below them ends)
    chain: tuple[str, ...]
    #: the member name (the job's namespaced idempotency key)
    member: str
    #: :data:`SUCCEEDED` or :data:`FAILED`
    outcome: str
    task_id: str
    #: the dead-letter record, for a failure
    dead_letter_id: str = ""


@dataclass(frozen=True)
class BatchStatus:
    """A batch as the store holds it now."""

    id: str
    total: int
    pending: int
    succeeded: int
    failed: int
    #: whether the submitter published every member (a crash before: the next submit
    #: of the same key publishes them again, deduplicated by their keys)
    published: bool
    created_at: datetime | None
    #: when ``pending`` first reached 0
    ended_at: datetime | None
    parent: str | None
    #: callback name -> its signature (``task``, ``kwargs``)
    callbacks: dict[str, dict[str, Any]]
    #: callback name -> :data:`WAITING`, :data:`DUE` or :data:`SENT`
    callback_states: dict[str, str]
    #: member name -> (state, task id of the run that ended it, dead-letter id)
    members: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    #: when a member last moved (Redis keeps it; None on SQL, and before any move)
    moved_at: datetime | None = None

    @property
    def last_moved(self) -> datetime | None:
        """When the batch last moved: a member's last move, else its end, else its making."""
        return self.moved_at or self.ended_at or self.created_at

    @property
    def ended(self) -> bool:
        return self.pending == 0

    @property
    def dead_letter_ids(self) -> list[str]:
        """The dead-letter records of the members that are failed now."""
        return sorted(dl for state, _, dl in self.members.values() if state == FAILED and dl)

    def callback_task_id(self, which: str) -> str:
        return callback_task_id(self.id, which)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "total": self.total, "pending": self.pending,
            "succeeded": self.succeeded, "failed": self.failed, "published": self.published,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "moved_at": self.moved_at.isoformat() if self.moved_at else None,
            "parent": self.parent, "callbacks": self.callback_states,
            "dead_letter_ids": self.dead_letter_ids,
        }  # fmt: skip


def callback_task_id(batch_id: str, which: str) -> str:
    """The task id of a batch's callback: one per batch and callback, so that a publish
    made again (the sweep) is the same job."""
    return f"batch-{which}-{batch_id}"


def parse_member(value: str) -> tuple[str, str, str]:
    """A member entry ``<state>|<task id>|<dead-letter id>`` as a tuple."""
    state, _, rest = value.partition("|")
    task_id, _, dead = rest.partition("|")
    return state, task_id, dead
