"""Batches: N convention jobs and a callback that runs once, after every one has ended.

``app.batch(key, on_success=..., on_complete=...)`` makes a :class:`Batch`; members are
added with :meth:`Batch.add` (a convention task and its payload), nested batches with
:meth:`Batch.batch`, and :meth:`Batch.submit` makes the batch in the store and publishes
the members. Why not Celery's chord: its Redis counter and ``chord_unlock`` live apart
from the jobs' own outcomes (celery/celery#4207, #3363, #2556); here the batch's state is
in the layer's store and moves in the same step as each member's completion or dead
letter (:mod:`conventions.store.batches`), so the callback cannot be lost nor run twice.

Idempotency: the batch's key is its id. Submitting the same key again does not make a
second batch: the members are published again only when the first submit did not
finish (each with the task id it had then: :func:`~conventions.batches.members.member_task_id`),
and nothing is published when it did. A member is named by its namespaced idempotency
key: two members with one key in one batch tree are refused at :meth:`Batch.add` (they
would be one job, and one batch would wait for it for ever).

Every member either sends its job or is settled before :meth:`Batch.submit` answers
(:mod:`conventions.batches.members`): a member whose key is done already ends as
succeeded; a key held by a job not done, or a queue bound the batch would cross, refuses
the batch with nothing published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conventions.batches import callbacks, ids, members
from conventions.batches.callbacks import BATCH_FIELD
from conventions.errors import ConfigurationError, PayloadError
from conventions.store import batches as b


@dataclass(frozen=True)
class Submitted:
    """What :meth:`Batch.submit` answers."""

    id: str
    #: False when a batch of this key existed (nothing new was made)
    created: bool
    #: how many member jobs were published (a member whose key was done already is
    #: not: it ended as succeeded; 0 when the batch was submitted whole before)
    published: int
    store: Any = field(repr=False, compare=False)

    def status(self) -> b.BatchStatus | None:
        """The batch now (:class:`~conventions.store.batches.BatchStatus`)."""
        return self.store.get_batch(self.id)  # type: ignore[no-any-return]


@dataclass
class _Member:
    task: Any
    kwargs: dict[str, Any]
    name: str


class Batch:
    """A batch being declared (see the module). Not thread-safe; submit it once."""

    def __init__(
        self,
        app: Any,
        key: str,
        *,
        on_success: Any = None,
        on_complete: Any = None,
        parent: Batch | None = None,
    ) -> None:
        around = parent.chain if parent is not None else ()
        self.app, self.id, self.parent = app, ids.checked(key, around), parent
        self.callbacks = {
            which: _callback(app, which, signature, key)
            for which, signature in ((b.ON_SUCCESS, on_success), (b.ON_COMPLETE, on_complete))
            if signature is not None
        }
        self.members: list[_Member] = []
        self.children: list[Batch] = []
        #: member name -> the batch it is in, shared by the whole tree
        self._names: dict[str, str] = parent._names if parent is not None else {}

    @property
    def chain(self) -> tuple[str, ...]:
        """This batch's id and its parents', innermost first (the ``cc_batch`` header)."""
        return (self.id, *(self.parent.chain if self.parent else ()))

    def add(self, task: Any, **payload: Any) -> None:
        """Add a member: ``task`` (a convention task) with its payload fields. A key
        already in this batch tree is refused: one job cannot end two members."""
        if not hasattr(task, "prepare"):
            raise ConfigurationError(f"a batch member must be a convention task, not {task!r}")
        _, name, _ = task.prepare(dict(payload), {})  # checked now, as .delay() would
        holder = self._names.get(name)
        if holder is not None:
            where = "this batch" if holder == self.id else f"batch {holder!r} of the same tree"
            raise ConfigurationError(
                f"batch {self.id!r}: the idempotency key {name!r} is a member of {where} "
                "already (one job would end one of them, and the other would wait for ever)"
            )
        self._names[name] = self.id
        self.members.append(_Member(task, dict(payload), name))

    def batch(self, key: str, *, on_success: Any = None, on_complete: Any = None) -> Batch:
        """A nested batch, a member of this one: it counts as succeeded here when all of
        its own members succeeded, and as failed when one failed (until a replay)."""
        child = Batch(self.app, key, on_success=on_success, on_complete=on_complete, parent=self)
        self.children.append(child)
        return child

    def spec(self) -> b.BatchSpec:
        names = [m.name for m in self.members] + [b.nested_member(c.id) for c in self.children]
        if not names:
            raise ConfigurationError(f"batch {self.id!r} has no member")
        if len(set(names)) != len(names):
            raise ConfigurationError(
                f"batch {self.id!r}: two members share an idempotency key (they would be one job)"
            )
        parent = self.parent.id if self.parent else None
        root = self.chain[-1] if self.parent else None
        return b.BatchSpec(self.id, tuple(names), self.callbacks, parent, root)

    def _all(self) -> list[Batch]:
        return [self, *(grand for child in self.children for grand in child._all())]

    def _check_tree(self, every: list[Batch]) -> None:
        """Every batch of the tree has an id of its own, in this tree and in the store: a
        nested id already taken by a batch of another parent would name two batches."""
        seen: set[str] = set()
        for batch in every:
            if batch.id in seen:
                raise ConfigurationError(
                    f"batch id {batch.id!r} is declared twice in batch {self.id!r}'s tree"
                )
            seen.add(batch.id)
        store = self.app.store
        for batch in every:
            parent = batch.parent.id if batch.parent else None
            found = store.get_batch(batch.id, members=False)
            if found is not None and found.parent != parent:
                raise ConfigurationError(
                    f"batch id {batch.id!r} is taken by a batch "
                    + (f"nested in {found.parent!r}" if found.parent else "submitted on its own")
                    + ": a batch takes an id of its own"
                )

    def submit(self) -> Submitted:
        """Make the batch (and its nested ones) in the store, then publish every member;
        a batch already submitted whole publishes nothing (see the module). Refused with
        nothing published: KeyHeld, KeyConflict, QueueOverCapacity
        (:mod:`conventions.batches.members`)."""
        if self.parent is not None:
            raise ConfigurationError("submit the outermost batch: it submits the nested ones")
        store = self.app.store
        every = self._all()
        specs = [batch.spec() for batch in every]  # every check before any write
        self._check_tree(every)
        status = store.get_batch(self.id, members=False)
        if status is not None and status.published:
            return Submitted(self.id, False, 0, store)
        jobs = [m for batch in every for m in batch.jobs()]
        members.admit(self.id, jobs)
        members.reserve(store, jobs)  # refused: every reservation given back
        try:
            created = store.create_batch(specs[0])
            for spec in specs[1:]:
                store.create_batch(spec)
            callbacks.publish_due(self.app, members.end_done(store, jobs))
        except BaseException:
            members.release(store, [m for m in jobs if m.done_by is None])
            raise
        published = self._publish(store, [m for m in jobs if m.done_by is None])
        for batch in reversed(every):
            store.mark_batch_published(batch.id)
        return Submitted(self.id, created, published, store)

    def jobs(self) -> list[members.Member]:
        """This batch's own member jobs, ready to publish (task ids and headers)."""
        found = [members.Member(m.task, m.kwargs, m.name, self.chain) for m in self.members]
        for member in found:
            member.prepare()
        return found

    @staticmethod
    def _publish(store: Any, jobs: list[members.Member]) -> int:
        """Publish each member; a failure gives back the reservations of the ones left
        (the batch is not marked published: a submit made again publishes them)."""
        for index, member in enumerate(jobs):
            try:
                members.publish(store, member)
            except BaseException:
                members.release(store, jobs[index:])
                raise
        return len(jobs)


def _callback(app: Any, which: str, signature: Any, batch_id: str) -> dict[str, Any]:
    """A callback's signature as the store keeps it, checked: a convention task whose
    payload takes ``batch_id`` and whose key template uses it (else the callbacks of two
    batches would share a key, and the second would be skipped as done)."""
    name = getattr(signature, "task", None) or getattr(signature, "name", None)
    kwargs = dict(getattr(signature, "kwargs", None) or {})
    task = app.tasks.get(name) if name else None
    payload = getattr(task, "payload", None)
    if task is None or payload is None or BATCH_FIELD not in payload.model_fields:
        raise ConfigurationError(
            f"{which}={signature!r}: a batch callback is a convention job whose payload "
            f"has a {BATCH_FIELD!r} field (the layer fills it), given as task.s(**fields)"
        )
    template = getattr(task, "key", None)
    if isinstance(template, str) and "{" + BATCH_FIELD + "}" not in template:
        raise ConfigurationError(
            f"{which}: {name}'s key template {template!r} must use {{{BATCH_FIELD}}}, so "
            "that each batch's callback has a key of its own"
        )
    # a bad callback fails now, with the id it will carry (``ids``: what it must take)
    parsed = payload.parse({**kwargs, BATCH_FIELD: batch_id}, task=name)
    if callable(template):
        _check_callable_key(which, task, kwargs, batch_id, parsed)
    return {"task": name, "kwargs": kwargs}


def _check_callable_key(
    which: str, task: Any, kwargs: dict[str, Any], batch_id: str, parsed: Any
) -> None:
    """A callable key must change with the batch id, as a template must name it: else
    every batch's callback has one key, and the second batch's is skipped as done. Told
    by the key of another id the payload takes (none taken: nothing to compare)."""
    for other in _other_ids(batch_id):
        try:
            beside = task.payload.parse({**kwargs, BATCH_FIELD: other}, task=task.name)
        except PayloadError:
            continue
        if task.key_for(beside) == task.key_for(parsed):
            raise ConfigurationError(
                f"{which}: {task.name}'s key gives {task.key_for(parsed)!r} whatever the "
                f"batch id ({batch_id!r} and {other!r} alike): it must use the payload's "
                f"{BATCH_FIELD!r}, so that each batch's callback has a key of its own"
            )
        return


def _other_ids(batch_id: str) -> list[str]:
    """Ids of the same length and shape as ``batch_id`` that differ from it in their
    last character (a digit for a digit, a letter for a letter), then a short one."""
    last = batch_id[-1:]
    swaps = ("0", "1") if last.isdigit() else ("a", "b") if last.isalpha() else ("_", "-")
    found = [batch_id[:-1] + swap for swap in swaps] + ["b1", "b2"]
    return [other for other in found if other != batch_id]
