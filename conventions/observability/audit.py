"""The audit trail: one event per lifecycle step, findable by correlation id.

Recording never breaks a job: a store error while writing an audit event is logged and
swallowed (like a failing dramatiq middleware hook), the job's own outcome stands.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from conventions.observability import runs
from conventions.store.base import Store
from conventions.store.records import AuditEvent, utcnow
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
    at: datetime | None = None,
) -> AuditEvent:
    """An audit event for a job carrying ``headers`` (ours, from a publish or a request),
    with the change it makes to the job's run record (:func:`runs.patch_for`)."""
    found = AuditEvent(
        event=name,
        task=task,
        task_id=task_id,
        correlation_id=str(headers.get(hdr.CORRELATION) or ""),
        causation_id=headers.get(hdr.CAUSATION),
        idempotency_key=headers.get(hdr.IDEMPOTENCY_KEY),
        attempt=attempt,
        detail=dict(detail or {}),
        at=at or utcnow(),
    )
    try:
        change = runs.patch_for(found, headers)
    except Exception:  # a run record is never worth a job: the event goes without it
        logger.exception("could not build the run change of %s of %s", name, task_id)
        return found
    return found.with_run(change)


def due_detail(options: Mapping[str, Any]) -> dict[str, Any]:
    """``{"due": <ISO time>}`` for a publish with a ``countdown`` or an ``eta`` (its run is
    ``delayed`` until it starts), else ``{}``: the ``published`` event's detail."""
    eta, countdown = options.get("eta"), options.get("countdown")
    if eta:
        return {"due": eta.isoformat() if isinstance(eta, datetime) else str(eta)}
    if countdown and float(countdown) > 0:
        return {"due": (utcnow() + timedelta(seconds=float(countdown))).isoformat()}
    return {}


def record(
    store: Store,
    name: str,
    task: str,
    task_id: str,
    headers: Mapping[str, Any],
    *,
    attempt: int = 0,
    detail: Mapping[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    """Write one audit event (as of ``at``, default now); never raises."""
    try:
        store.add_audit(event(name, task, task_id, headers, attempt=attempt, detail=detail, at=at))
    except Exception:
        logger.exception("could not record audit event %s of %s", name, task_id)
