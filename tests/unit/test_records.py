"""Records round-trip through their JSON-ready form."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from conventions.store.records import AuditEvent


def test_an_audit_event_round_trips_through_to_dict_with_every_field() -> None:
    event = AuditEvent(
        event="retried", task="email.send_receipt.v2", task_id="t1", correlation_id="c1",
        causation_id="job:t0", idempotency_key="receipt:ord_1", attempt=2,
        at=datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC), detail={"delay": 1.5},
    )  # fmt: skip
    data = event.to_dict()
    assert set(data) == {f.name for f in dataclasses.fields(AuditEvent)}
    assert AuditEvent.from_dict(data) == event
