"""The store interface: one contract, two backends (Redis and SQL).

The store keeps what the layer needs beside the broker: enqueue dedup reservations,
the execution ledger (with per-delivery counts for poison detection), dead letters and
the audit trail. Every uniqueness rule is enforced by the store itself (``SET NX``, a
unique row, a Lua script or a conditional ``UPDATE``), never by a read-then-write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from conventions.store.batches import BatchMove, BatchSpec, BatchStatus
from conventions.store.records import AuditEvent, Category, Claim, DeadLetter, Holder
from conventions.store.runs import Run


@dataclass(frozen=True)
class KeyState:
    """What the store holds for one idempotency key (``conventions keys show``); an
    expired reservation or ledger entry is no longer there."""

    key: str
    #: the job id holding the enqueue reservation, or None
    reserved_by: str | None = None
    #: when the reservation runs out (None: no reservation, or one without a ttl)
    reserved_until: datetime | None = None
    #: the ledger entry: ``running`` (a live lease) or ``done``, or None
    ledger_state: str | None = None
    #: the execution that holds the lease, or that recorded done
    ledger_owner: str | None = None
    ledger_outcome: str | None = None
    #: the end of the lease (running) or of the keep period (done)
    ledger_until: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.reserved_by is None and self.ledger_state is None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("reserved_until", "ledger_until"):
            moment = data[name]
            data[name] = moment.isoformat() if moment is not None else None
        return data


@runtime_checkable
class Store(Protocol):
    """What both backends implement; ``tests/integration/test_store_contract.py`` checks it."""

    # -- enqueue dedup ---------------------------------------------------------------
    def reserve(
        self,
        key: str,
        job_id: str,
        ttl: float | None,
        *,
        audit: AuditEvent | None = None,
        fingerprint: str | None = None,
    ) -> Holder | None:
        """Reserve ``key`` for ``job_id`` atomically; record ``audit`` in the same round
        trip, only when this call made the reservation.

        Returns None when the reservation is ours (including when ``job_id`` already
        held it: reserving again is idempotent and does not extend the ttl), else the job
        id that holds it, as a :class:`~conventions.store.records.Holder` carrying the payload
        ``fingerprint`` it reserved with (the caller compares: the store keeps it, never
        judges it). ``ttl`` (seconds) bounds the reservation; None keeps it until
        released. An expired reservation goes to the next job that reserves.
        """
        ...

    def unreserve(self, key: str, job_id: str) -> None:
        """Drop the reservation, only if ``job_id`` still holds it."""
        ...

    def key_state(self, key: str) -> KeyState:
        """``key``'s reservation and ledger entry, as they are now (an operator's look)."""
        ...

    def clear_key(self, key: str, *, audit: AuditEvent | None = None) -> KeyState:
        """Drop ``key``'s reservation and ledger entry, whoever holds them, and record
        ``audit``, atomically; answers what was there (an operator's repair, after a
        purged queue: the next publish and the next delivery of the key start afresh)."""
        ...

    # -- execution ledger --------------------------------------------------------------
    def claim(
        self,
        key: str,
        owner: str,
        lease: float,
        delivery_id: str,
        *,
        audit: AuditEvent | None = None,
    ) -> Claim:
        """Claim ``key`` for the execution ``owner`` for ``lease`` seconds.

        Free key, or a lease that expired (its owner died): the claim is taken and the
        delivery counter of ``delivery_id`` is incremented and returned. Key already done
        (within its ``keep``): ``DONE`` with its outcome and the fingerprint recorded
        with it. Key held by a live lease
        (``owner``'s own included): ``HELD``. ``deliveries`` is 0 unless ``CLAIMED``.
        One round trip on Redis; ``audit`` is recorded in it, only when the claim is taken.
        """
        ...

    def renew(self, key: str, owner: str, lease: float) -> bool:
        """Extend ``owner``'s lease to ``lease`` seconds from now; False when the lease is no
        longer ours (expired, taken over, released or completed)."""
        ...

    def complete(
        self,
        key: str,
        owner: str,
        outcome: str,
        keep: float,
        reserved_by: str | None,
        *,
        audit: AuditEvent | None = None,
        fingerprint: str | None = None,
        delivery_id: str | None = None,
        batch: BatchMove | None = None,
    ) -> list[str]:
        """Record ``key`` as done for ``keep`` seconds (with the payload ``fingerprint``
        of the run), drop the enqueue reservation held by ``reserved_by`` (when given)
        and record ``audit``, atomically (one round trip on Redis). The claim counter of
        ``delivery_id`` may go with it (Redis drops it: a done key is never claimed
        again).

        Done is recorded when ``owner`` still holds the lease, or when the entry has
        expired (the lease ran out but the body finished: its result stands). A live
        lease of another execution, or a done entry, is left as it is.

        ``batch``: the job is a batch member; its end is moved in the same step
        (:mod:`conventions.store.batches`), and the callbacks that made due are answered
        (``<batch id>|<callback>``), for the caller to publish. A job in no batch pays
        nothing for it.
        """
        ...

    def release(self, key: str, owner: str, reserved_by: str | None) -> None:
        """Give the claim up (retryable failure, dead letter) if ``owner`` still holds it,
        and drop the enqueue reservation held by ``reserved_by`` (when given)."""
        ...

    # -- dead letters -------------------------------------------------------------------
    def put_dead_letter(self, record: DeadLetter, *, batch: BatchMove | None = None) -> list[str]:
        """Store (or overwrite, by id) a dead-letter record; ``batch``: the member's end
        (failed), moved in the same step, as :meth:`complete` does."""
        ...

    def get_dead_letter(self, record_id: str) -> DeadLetter | None: ...

    def swap_replayed_at(self, record_id: str, seen: datetime | None, at: datetime | None) -> bool:
        """Set the record's ``replayed_at`` to ``at`` if it is still ``seen``, atomically
        (compare-and-set): False when another replay changed it first or the record is
        gone. A replay claims its record this way before it publishes, and gives the
        claim back (``seen`` its own ``at``) when the publish fails."""
        ...

    def list_dead_letters(
        self,
        task: str | None = None,
        category: Category | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[DeadLetter]:
        """Newest first, filtered; never scans more than needed for ``limit`` records
        of the filter (indexes, not full scans)."""
        ...

    def count_dead_letters(self) -> int: ...

    def delete_dead_letter(self, record_id: str) -> bool: ...

    def purge_dead_letters(self, older_than: datetime) -> int:
        """Delete records whose last failure is before ``older_than``; return how many."""
        ...

    # -- batches (conventions.store.batches) --------------------------------------------
    def create_batch(self, spec: BatchSpec) -> bool:
        """Make the batch with every member pending, unless a batch of that id exists
        (then nothing changes); True when this call made it."""
        ...

    def mark_batch_published(self, batch_id: str) -> None:
        """Every member of the batch is published (a submit that finished)."""
        ...

    def end_member(self, move: BatchMove) -> list[str]:
        """A member's end by itself (a member whose key was done already, or skipped);
        the callbacks made due, as :meth:`complete`."""
        ...

    def callback_sent(self, batch_id: str, which: str) -> None:
        """The due callback ``which`` of the batch was published."""
        ...

    def due_callbacks(self, grace: float, limit: int = 100) -> list[str]:
        """The callbacks (``<batch id>|<callback>``) due for longer than ``grace``
        seconds and not marked sent (the sweep publishes them again), on the store's
        clock."""
        ...

    def get_batch(self, batch_id: str, *, members: bool = True) -> BatchStatus | None:
        """The batch now (with each member's state, unless ``members`` is off)."""
        ...

    def list_batches(self, limit: int = 100) -> list[BatchStatus]:
        """The newest batches first, without their members."""
        ...

    def purge_batches(self, older_than: datetime) -> int:
        """Delete the batches that ended before ``older_than`` with no callback left due
        (a batch not ended is kept); return how many."""
        ...

    # -- audit trail --------------------------------------------------------------------
    def add_audit(self, event: AuditEvent) -> None: ...

    def audit_for(self, correlation_id: str) -> list[AuditEvent]:
        """Every event of one correlation id, oldest first."""
        ...

    def counters(self) -> dict[tuple[str, str], int]:
        """Every counter the audit events moved, by (name, task): each recorded event
        adds to ``(event, task)`` in the same step as the event itself (a dead letter to
        ``("dead_lettered:<category>", task)``), plus the wait and run histograms of
        :mod:`conventions.store.counts`. Read by the metrics exporter."""
        ...

    def purge_audit(self, older_than: datetime) -> int:
        """Delete the trails whose last event is before ``older_than`` (a trail with a
        recent event is kept whole); return how many events were deleted."""
        ...

    # -- run history (conventions.store.runs) -------------------------------------------
    # Written only with the audit events (each carries its run's change), never on its own.
    def get_run(self, task_id: str) -> Run | None:
        """The run record of job ``task_id``, or None."""
        ...

    def list_runs(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        **filters: str | None,
    ) -> list[Run]:
        """Newest first (by creation), filtered by ``task``, ``state``, ``key``,
        ``correlation_id`` and ``queue`` (each None: any) and creation time."""
        ...

    def count_runs(self) -> int: ...

    def purge_runs(self, older_than: datetime) -> int:
        """Delete the runs created before ``older_than``; return how many."""
        ...

    # -- leases -----------------------------------------------------------------------
    # Named leases for everything that must not run twice at once across workers: per-key
    # locks, concurrency slots, schedule overlap. A lease ends when released or when its
    # ttl runs out, so a crashed holder never leaves it taken.
    def acquire(self, name: str, owner: str, ttl: float) -> str | None:
        """Take lease ``name`` for ``owner`` for ``ttl`` seconds; None when it is ours (a
        free or expired lease, or ``owner``'s own, which is extended), else the holder."""
        ...

    def renew_lease(self, name: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s lease to ``ttl`` seconds from now; False when it is not ours."""
        ...

    def release_lease(self, name: str, owner: str) -> bool:
        """Give the lease up if ``owner`` holds it; True when it did."""
        ...

    def lease_holder(self, name: str) -> str | None:
        """Who holds lease ``name`` now, or None."""
        ...

    def acquire_any(self, names: Sequence[str], owner: str, ttl: float) -> str | None:
        """Take the first free lease of ``names``, in that order, for ``owner`` (a
        concurrency slot); return its name, or None when every one is held by others."""
        ...

    # -- token buckets (dependency rate limits) ----------------------------------------
    # One bucket per name, held by the store so that every worker shares it, with the
    # store's clock (Redis ``TIME``; the database's clock on SQL). The algorithm is
    # ``conventions.store.tokens.step``.
    def take_token(
        self, name: str, interval: float, burst: int, max_wait: float, booked: bool
    ) -> float:
        """Take a token of bucket ``name`` (one every ``interval`` seconds, ``burst`` at
        once) now and return 0, or return the seconds to wait. A caller that has not
        ``booked`` yet books a place in line when that wait is at most ``max_wait``, and
        comes back then with ``booked=True``."""
        ...

    def pause_tokens(self, name: str, seconds: float) -> None:
        """No token of bucket ``name`` is taken for ``seconds`` from now (a dependency
        answered 429 with Retry-After); a pause is only ever extended, never shortened."""
        ...

    # -- small state records -------------------------------------------------------------
    # JSON documents by name (checkpoints, progress, schedule runs): last write wins.
    def put_state(self, name: str, value: Mapping[str, Any], ttl: float | None) -> None:
        """Store ``value`` under ``name`` for ``ttl`` seconds (None: until deleted)."""
        ...

    def get_state(self, name: str) -> dict[str, Any] | None: ...

    def delete_state(self, name: str) -> None: ...

    def close(self) -> None: ...
