"""The bench's ``quiet_bare`` variant (``python -m bench promises``) measures a job
without the claim's and the completion's audit events: its store really writes none,
and still claims and completes the ledger (what it must keep to measure the rest)."""

from __future__ import annotations

import uuid

import redis

from bench import apps, drain
from conventions.observability import audit
from conventions.store.records import ClaimStatus
from conventions.tracing import headers as hdr

TASK = apps.task_name("quiet_bare")


def test_the_bare_variant_claims_and_completes_without_audit_events(
    clean_store: redis.Redis,
) -> None:
    store = apps.quiet_bare.store
    assert store is apps.quiet_bare.store  # wrapped once, kept
    for variant in drain.PROMISES:  # every variant of the section can be launched
        assert variant in drain.LABELS
    job, key = str(uuid.uuid4()), f"noop:{uuid.uuid4().hex}"
    head = {hdr.CORRELATION: str(uuid.uuid4()), hdr.IDEMPOTENCY_KEY: key}
    started = audit.event("started", TASK, job, head, attempt=1)
    claim = store.claim(key, "owner-1", 30, job, audit=started)
    assert claim.status is ClaimStatus.CLAIMED
    done = audit.event("succeeded", TASK, job, head, attempt=1)
    store.complete(key, "owner-1", "succeeded", 60, None, audit=done, delivery_id=job)
    assert store.claim(key, "owner-2", 30, str(uuid.uuid4())).status is ClaimStatus.DONE
    assert store.audit_for(head[hdr.CORRELATION]) == []
    # the plain store of the same process records both events
    plain = apps.quiet.store
    other = {hdr.CORRELATION: str(uuid.uuid4()), hdr.IDEMPOTENCY_KEY: f"{key}:plain"}
    plain.claim(f"{key}:plain", "owner-1", 30, job, audit=audit.event("started", TASK, job, other))
    assert [event.event for event in plain.audit_for(other[hdr.CORRELATION])] == ["started"]
