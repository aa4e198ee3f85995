"""The audit trail's size on Redis is bounded and predictable: compact events, a cap on
the events of one trail and on the number of trails, the caps read from the settings.
Against the real store Redis (``MEMORY USAGE``) and a real job in the thread worker."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis

from conventions import App, JobContext, Payload, bind
from conventions.store import RedisStore, keys
from conventions.store.records import AuditEvent, utcnow
from tasks import app
from tests.conftest import REDIS_BASE, STORE_DB
from tests.integration.helpers import wait_for

#: what a job's trail (published, started, succeeded) may take in Redis (``MEMORY
#: USAGE``): the full JSON form took 1,464 bytes, the compact one takes about 630
TRAIL_BUDGET = 800


class Sized(Payload):
    call_id: str


@app.job("testing.audit_sized.v1", payload=Sized, key="sized:{call_id}", workload="email")
def audit_sized(payload: Sized, ctx: JobContext) -> str:
    return payload.call_id


@pytest.fixture
def store(clean_store: redis.Redis) -> Iterator[RedisStore]:
    """A Redis store of the test's own prefix, with small caps."""
    client = redis.Redis.from_url(f"{REDIS_BASE}/{STORE_DB}", decode_responses=True)
    yield RedisStore(
        client, prefix=f"cc-bounds-{uuid.uuid4().hex}:", audit_max_trails=3, audit_max_events=4
    )
    client.close()


def _event(
    correlation_id: str, name: str = "started", seconds: float = 0, task_id: str | None = None
) -> AuditEvent:
    return AuditEvent(
        name, "testing.audit_sized.v1", task_id or uuid.uuid4().hex, correlation_id,
        causation_id="request:r1", idempotency_key="sized:1", attempt=1,
        at=utcnow() + timedelta(seconds=seconds), detail={"wait_s": 0.01},
    )  # fmt: skip


@pytest.mark.usefixtures("thread_worker")
def test_a_jobs_audit_trail_takes_less_than_its_budget_of_redis_memory(
    clean_store: redis.Redis,
) -> None:
    call, correlation = uuid.uuid4().hex, uuid.uuid4().hex
    with bind(correlation_id=correlation):
        job = audit_sized.delay(call_id=call)
    assert job.get(timeout=30) == call
    trail = keys.audit(correlation)
    wait_for(lambda: clean_store.llen(trail) >= 3, timeout=10)
    events = [json.loads(raw) for raw in clean_store.lrange(trail, 0, -1)]
    names = [event.get("e", event.get("event")) for event in events]
    assert names == ["published", "started", "succeeded"]
    used = int(clean_store.memory_usage(trail) or 0)
    print(f"\naudit: one job's trail takes {used} bytes in Redis (MEMORY USAGE)")
    assert used <= TRAIL_BUDGET


def test_a_trail_keeps_its_newest_events_up_to_its_cap(store: RedisStore) -> None:
    for i in range(7):
        store.add_audit(_event("corr-long", f"step-{i}", seconds=i))
    assert [e.event for e in store.audit_for("corr-long")] == [f"step-{i}" for i in range(3, 7)]


def test_beyond_the_trail_cap_the_trails_idle_longest_are_dropped(store: RedisStore) -> None:
    for i in range(5):
        store.add_audit(_event(f"corr-{i}", seconds=i))
    kept = [i for i in range(5) if store.audit_for(f"corr-{i}")]
    assert kept == [2, 3, 4]
    assert store.client.zcard(keys.audit_by_time(store.prefix)) == 3


def test_the_caps_hold_for_events_recorded_with_a_ledger_step(store: RedisStore) -> None:
    for i in range(5):
        store.claim(f"key-{i}", "exec", 30, f"delivery-{i}", audit=_event(f"corr-{i}", seconds=i))
    for _ in range(6):
        store.reserve("key-x", "job-x", 30, audit=_event("corr-4", "published", seconds=9))
        store.unreserve("key-x", "job-x")
    assert [i for i in range(5) if store.audit_for(f"corr-{i}")] == [2, 3, 4]
    assert len(store.audit_for("corr-4")) == 4


def test_the_events_of_one_job_keep_its_job_fields_once_and_read_back_whole(
    store: RedisStore,
) -> None:
    written = [_event("corr-job", name, i, task_id="job-1") for i, name in enumerate("abc")]
    other = dataclasses.replace(_event("corr-job", "d", 3, task_id="job-1"), idempotency_key="x")
    for event in [*written, other]:
        store.add_audit(event)
    raw = [json.loads(e) for e in store.client.lrange(keys.audit("corr-job", store.prefix), 0, -1)]
    assert ["t" in event for event in raw] == [True, False, False, True]
    assert store.audit_for("corr-job") == [*written, other]


def test_jobs_interleaved_in_a_trail_and_an_older_releases_event_order_read_back_whole(
    store: RedisStore,
) -> None:
    store = RedisStore(store.client, prefix=store.prefix)  # no caps: six events kept
    trail = keys.audit("corr-mix", store.prefix)
    # an event as 0.1.0 wrote it (its fields in another order): passed over, never leaned on
    older = _event("corr-mix", "published", 0, task_id="job-0")
    store.client.rpush(trail, json.dumps(older.to_compact(), separators=(",", ":")))
    written = [
        _event("corr-mix", "started", 1, task_id="job-0"),
        _event("corr-mix", "published", 2, task_id="job-1"),
        _event("corr-mix", "started", 3, task_id="job-0"),
        dataclasses.replace(_event("corr-mix", "started", 4, task_id="job-1"), task="other.v1"),
        dataclasses.replace(_event("corr-mix", "succeeded", 5, task_id="job-1"), task="other.v1"),
    ]
    for event in written:
        store.add_audit(event)
    raw = [json.loads(e) for e in store.client.lrange(trail, 0, -1)]
    # job-0's first new event keeps its fields (the older one is not compared), the
    # second leans on it across job-1's; job-1's other task is kept whole, and its next
    # event is short against that one
    assert ["t" in event for event in raw] == [True, True, True, False, True, False]
    assert store.audit_for("corr-mix") == [older, *written]
    assert store.audit_for("corr-mix")[-1].task == "other.v1"


def test_trimming_a_trail_gives_the_next_event_of_a_job_the_fields_it_leaned_on(
    store: RedisStore,
) -> None:
    written = [_event("corr-trim", f"step-{i}", i, task_id="job-1") for i in range(6)]
    for event in written:
        store.add_audit(event)
    assert store.audit_for("corr-trim") == written[2:]


def test_a_trail_written_in_the_full_form_before_the_compact_one_still_reads(
    store: RedisStore,
) -> None:
    old = _event("corr-old", "published")
    store.client.rpush(keys.audit("corr-old", store.prefix), json.dumps(old.to_dict()))
    store.add_audit(_event("corr-old", "started", seconds=1))
    assert [e.event for e in store.audit_for("corr-old")] == ["published", "started"]
    assert store.audit_for("corr-old")[0] == old


def test_a_compact_event_reads_back_equal_and_leaves_out_its_correlation_id() -> None:
    event = _event("corr-c", "retried")
    compact = event.to_compact()
    assert "corr-c" not in json.dumps(compact)
    assert AuditEvent.from_compact(compact, "corr-c") == event
    assert len(json.dumps(compact, separators=(",", ":"))) < len(json.dumps(event.to_dict())) / 1.5


def test_the_audit_caps_and_lifetime_come_from_the_settings() -> None:
    configured = App("audit_bounds", set_as_current=False)
    configured.conf.update(
        conventions_store_url=f"{REDIS_BASE}/{STORE_DB}",
        conventions_audit_max_trails=1000,
        conventions_audit_max_events=50,
        conventions_audit_retention_seconds=3 * 86400,
    )
    store = configured.store
    assert isinstance(store, RedisStore)
    assert (store.audit_max_trails, store.audit_max_events) == (1000, 50)
    assert store.audit_ttl == 3 * 86400
    store.close()
