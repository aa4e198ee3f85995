"""Discarding dead letters on purpose: the record deleted, the deletion on the record.

Retention purges dead letters by age; an operator discards the ones nobody will replay
(a test order, a customer who left) before then, with a reason. Each discarded record
leaves a ``discarded`` audit event in its job's trail (its correlation id, else
``dead-letter:<id>``) naming the actor, the reason and what the record was, so that
``conventions trace`` still tells what became of the job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conventions.observability import audit
from conventions.tracing import headers as hdr

if TYPE_CHECKING:
    from conventions.app import App


def discard(app: App, record_id: str, *, reason: str, actor: str) -> bool:
    """Delete dead letter ``record_id`` and audit it; False when there was no such record.

    Raises ``ValueError`` for an empty reason."""
    reason = reason.strip()
    if not reason:
        raise ValueError("discarding a dead letter needs a reason (it is kept in the audit)")
    store = app.store
    record = store.get_dead_letter(record_id)
    if record is None or not store.delete_dead_letter(record_id):
        return False
    headers = {
        hdr.CORRELATION: record.correlation_id or f"dead-letter:{record.id}",
        hdr.ACTOR: actor,
    }
    if record.idempotency_key:
        headers[hdr.IDEMPOTENCY_KEY] = record.idempotency_key
    detail = {
        "actor": actor, "reason": reason, "dead_letter_id": record.id,
        "category": str(record.category), "exc_type": record.exc_type,
    }  # fmt: skip
    audit.record(store, "discarded", record.task, record.task_id, headers, detail=detail)
    return True
