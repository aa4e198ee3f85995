"""The audit trail: one event per lifecycle step, findable by correlation id.

Recording never breaks a job: a store error while writing an audit event is logged and
swallowed (like a failing dramatiq middleware hook), the job's own outcome stands.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from conventions.store.base import Store
from conventions.store.records import AuditEvent
from conventions.tracing import headers as hdr

logger = logging.getLogger("conventions.observability.audit")


def event(
    name: str,
    task: str,
    task_id: str,
    headers: Mapping[str, Any],
    *,
    attempt: int = 0,
    detail: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """An audit event for a job carrying ``headers`` (ours, from a publish or a request)."""
    return AuditEvent(
        event=name,
        task=task,
        task_id=task_id,
        correlation_id=str(headers.get(hdr.CORRELATION) or ""),
        causation_id=headers.get(hdr.CAUSATION),
        idempotency_key=headers.get(hdr.IDEMPOTENCY_KEY),
        attempt=attempt,
        detail=dict(detail or {}),
    )


def record(
    store: Store,
    name: str,
    task: str,
    task_id: str,
    headers: Mapping[str, Any],
    *,
    attempt: int = 0,
    detail: Mapping[str, Any] | None = None,
) -> None:
    """Write one audit event; never raises."""
    try:
        store.add_audit(event(name, task, task_id, headers, attempt=attempt, detail=detail))
    except Exception:
        logger.exception("could not record audit event %s of %s", name, task_id)
