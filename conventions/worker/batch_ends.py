"""Every dead letter of a batch member ends it in its batch: the one place that says how.

A member's message carries its batches (``cc_batch``, innermost first) and its key
(``cc_idempotency_key``, the bare key its producer reserved). The member is named in
its batch by its namespaced key (:meth:`conventions.task.ConventionTask.prepare`), so
each way a message becomes a dead letter ends its member the same way, whether the
worker could derive the key from the payload or only read the one the message carries:

================================================  =========================  ==========
exit                                              where                      member key
================================================  =========================  ==========
newer format, too large, ETA, bad envelope        ``Consumer.refuse``        carried
unknown task, refused content, undecodable        ``consumer.record``        carried
invalid payload or key                            ``Delivery.validate``      carried
permanent, exhausted, bug, conflict, quarantine   ``Exits.dead_letter``      derived
hard time limit (payload parses / no longer)      ``dead_letter_hard_...``   derived / carried
poison queue (RabbitMQ delivery limit)            ``poison_queue.handle``    carried
revoked, expired (no record)                      ``reservations.release``   derived
================================================  =========================  ==========

The headers are read as untrusted input (``hdr.read_header``): a member's end moves only a
member of that name in that batch, and moves it once per outcome
(:mod:`conventions.store.batches`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conventions.store import keys
from conventions.store.batches import FAILED, BatchMove
from conventions.tracing import headers as hdr


@dataclass(frozen=True)
class MemberEnd:
    """A batch member as its message names it: its batches and its member name."""

    #: the batch ids, innermost first (the ``cc_batch`` header)
    chain: tuple[str, ...]
    #: the member name: the job's namespaced idempotency key
    member: str

    @property
    def root(self) -> str:
        """The outermost batch (its tree's partition on Redis Cluster)."""
        return self.chain[-1]

    def move(self, outcome: str, task_id: str, dead_letter_id: str = "") -> BatchMove:
        return BatchMove(self.chain, self.member, outcome, task_id, dead_letter_id)

    def failed(self, task_id: str, dead_letter_id: str) -> BatchMove:
        """The member's end by its dead letter ``dead_letter_id``."""
        return self.move(FAILED, task_id, dead_letter_id)

    def record_id(self, make: Callable[[], str] = lambda: uuid.uuid4().hex) -> str:
        """An id from ``make`` for the member's dead letter, in its batch tree's
        partition: on Redis Cluster its record and the batch move are one script."""
        return keys.id_in_partition(keys.batch_source(self.root), make)


def chain_of(headers: Mapping[str, Any]) -> tuple[str, ...]:
    """The batch ids of the ``cc_batch`` header, innermost first (none when absent or
    refused by the header's reader)."""
    chain = hdr.read_header(hdr.BATCH, headers.get(hdr.BATCH))
    return tuple(part for part in str(chain or "").split(",") if part)


def member_of(
    headers: Mapping[str, Any], task_name: object, key: str | None = None
) -> MemberEnd | None:
    """The member a message of task ``task_name`` is, or None when it is in no batch
    or names no key. ``key``: the namespaced key the worker derived from the payload;
    without it, the key the message carries (what its producer named the member by)."""
    chain = chain_of(headers)
    if not chain:
        return None
    if key is None:
        carried = hdr.read_header(hdr.IDEMPOTENCY_KEY, headers.get(hdr.IDEMPOTENCY_KEY))
        if not carried or not isinstance(task_name, str) or not task_name:
            return None
        key = keys.namespaced(task_name, str(carried))
    return MemberEnd(chain, key)
