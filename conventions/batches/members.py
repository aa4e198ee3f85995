"""A batch's members on their way out: every member either sends its job or is settled
before :meth:`~conventions.batches.declare.Batch.submit` answers.

A member publish that sends nothing would leave its batch pending for ever, so the
submit first takes every member's enqueue reservation (:func:`reserve`), in its batch's
partition, for the member's own task id (:func:`member_task_id`: the same in every
submit of the batch, so a submit made again finds its reservations its own). A key held
by another job is one of:

* **done** (its ledger says so; ``dedup="forever"`` or a TTL keeps the reservation after
  the run): the member ends as succeeded, as a member whose key another run did always
  has (:func:`end_done`), and nothing is published for it;
* **not done** (queued, running or retrying, outside the batch or in another one): the
  batch is refused with :class:`~conventions.errors.KeyHeld`, and so is a holder of
  another payload (:class:`~conventions.errors.KeyConflict`, as ``.delay()`` raises).

A refusal gives back every reservation this submit holds (:func:`release`): nothing of
the batch is left half-published. A queue bound (``conventions_backpressure``) the batch
would cross refuses it whole the same way, before any reservation (:func:`admit`).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from conventions.capacity import backpressure
from conventions.errors import KeyConflict, KeyHeld, QueueOverCapacity
from conventions.observability import audit
from conventions.store import batches as b
from conventions.store import keys
from conventions.tracing import headers as hdr

logger = logging.getLogger("conventions.batches")

#: the namespace of the members' task ids (uuid5 of the batch id and the member name)
_IDS: Final = uuid.UUID("6d1c2f1e-4c43-5b37-9a8e-2b0d3c8f4a17")
#: a key's ledger state once its job is done
_DONE: Final = "done"


def member_task_id(batch_id: str, name: str) -> str:
    """The task id of member ``name`` of batch ``batch_id``: one per member, the same in
    every submit of the batch (its reservation is found its own)."""
    return str(uuid.uuid5(_IDS, f"{batch_id}\x00{name}"))


@dataclass
class Member:
    """A member job as it is published: its task, payload, name (its namespaced
    idempotency key), the batches it is in (innermost first) and its task id."""

    task: Any
    kwargs: dict[str, Any]
    name: str
    chain: tuple[str, ...]
    task_id: str = ""
    #: its payload as the message carries it, and its headers (``cc_batch`` among them),
    #: made at the submit
    data: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)
    #: the job that did its key, when it is done already (nothing is published)
    done_by: str | None = None

    def prepare(self) -> None:
        """Its task id and headers, as of now."""
        self.task_id = member_task_id(self.chain[0], self.name)
        options = {"headers": {hdr.BATCH: ",".join(self.chain)}}
        self.data, _, self.headers = self.task.prepare(dict(self.kwargs), options)

    @property
    def reserves(self) -> bool:
        """Whether its task takes an enqueue reservation (``dedup`` is not None)."""
        return self.task.dedup is not None

    @contextmanager
    def home(self) -> Iterator[None]:
        """Its keys in its batch tree's partition (Redis Cluster), as its publish's are."""
        with keys.batch_home(self.name, self.chain[-1]):
            yield


def admit(batch_id: str, members: Sequence[Member]) -> None:
    """QueueOverCapacity, before anything is reserved or published, when publishing the
    members now would cross a queue's bound (whichever the tasks' ``overflow``: a
    member shed or refused half-way would leave the batch half-published)."""
    routed = [(backpressure.publish_queue(m.task, {}), m.task) for m in members]
    counts, tasks = Counter(queue for queue, _ in routed), dict(routed)
    for queue, count in counts.items():
        refusal = backpressure.room_for(tasks[queue], queue, count) if queue else None
        if refusal is not None:
            raise QueueOverCapacity(
                f"queue {refusal.queue!r} is over capacity ({refusal.reason}): batch "
                f"{batch_id!r} was not submitted and nothing was published; submit it "
                "again once the queue has room, or raise its bound",
                queue=refusal.queue,
            )


def reserve(store: Any, members: Sequence[Member]) -> None:
    """Take every member's reservation; a member whose key is done gets ``done_by``. A
    key held by a job that is not done (or by another payload) refuses the batch: every
    reservation taken is given back first."""
    taken: list[Member] = []
    try:
        for member in members:
            if member.reserves:
                _reserve_one(store, member)
                if member.done_by is None:
                    taken.append(member)
    except BaseException:
        release(store, taken)
        raise


def _reserve_one(store: Any, member: Member) -> None:
    task = member.task
    fingerprint = keys.fingerprint(task.name, member.data)  # as its publish's
    with member.home():
        holder = store.reserve(member.name, member.task_id, task.dedup_ttl(), audit=None,
                               fingerprint=fingerprint)  # fmt: skip
        if holder is None:
            return
        if keys.conflicting(getattr(holder, "fingerprint", None), fingerprint):
            raise KeyConflict(key=member.name, task=task.name)
        state = store.key_state(member.name)
    if state.ledger_state != _DONE:
        raise KeyHeld(
            f"batch {member.chain[0]!r}: member {member.name!r} is held by job {holder}, "
            "outside the batch and not done (queued, running or retrying): nothing was "
            "published; submit the batch once that job is done (its member then counts "
            "as succeeded), or leave the member out",
            key=member.name, holder=str(holder),
        )  # fmt: skip
    member.done_by = str(holder)


def release(store: Any, members: Iterable[Member]) -> None:
    """Give back the reservations of members that were not published (each only while
    the member still holds it). Never raises, so that the refusal or failure that called
    it is the one the caller sees: a store that does not answer keeps a reservation
    until its ttl (logged, as a publish that failed does)."""
    for member in members:
        if not member.reserves:
            continue
        try:
            with member.home():
                store.unreserve(member.name, member.task_id)
        except Exception:
            logger.warning("batch %s: the reservation of %r stays until it expires (the "
                           "store did not answer)", member.chain[0], member.name,
                           exc_info=True)  # fmt: skip


def end_done(store: Any, members: Iterable[Member]) -> list[str]:
    """End the members whose key was done already, as succeeded; the callbacks that
    made due (``<batch id>|<callback>``)."""
    fired: list[str] = []
    for member in members:
        if member.done_by is not None:
            move = b.BatchMove(member.chain, member.name, b.SUCCEEDED, member.done_by)
            fired += store.end_member(move)
            logger.info("batch %s: member %s ended as succeeded at the submit (its key "
                        "was done by job %s)", member.chain[0], member.name,
                        member.done_by)  # fmt: skip
    return fired


def publish(store: Any, member: Member) -> Any:
    """Publish one member, its reservation already taken: its ``published`` event first
    (the reservation's own step records none, being this job's already), then the job.
    A publish that sent nothing (shed past a bound, or its reservation lost meanwhile)
    raises: the batch is not whole."""
    task = member.task
    if member.reserves:
        with member.home():
            store.add_audit(audit.event("published", task.name, member.task_id, member.headers))
    result = task.apply_async(
        kwargs=member.kwargs, task_id=member.task_id, headers=dict(member.headers)
    )
    if getattr(result, "shed", False):
        raise QueueOverCapacity(
            f"member {member.name!r} of batch {member.chain[0]!r} was shed: its queue is "
            "over capacity; the batch is not whole: submit it again once the queue has room",
        )
    if getattr(result, "deduplicated", False):
        raise KeyHeld(key=member.name, holder=str(result.id))
    return result
