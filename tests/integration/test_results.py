"""Celery's result writes riding the ledger's steps (``conventions.results.redis``).

With the store and the result backend on one Redis server, a job's STARTED write goes
out in its claim's script and its SUCCESS write in its completion's: Redis ``MONITOR``
shows no ``SETEX`` or ``PUBLISH`` of the result key sent by a client, only by those two
scripts. Where Celery would not write SUCCESS right after the body (results ignored,
callbacks) the completion still happens, on its own; a value it cannot store is refused
before the completion (a ``bug`` dead letter).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from conventions import bind
from conventions.observability import audit
from conventions.results import redis as results
from conventions.store.records import Category, ClaimStatus
from conventions.store.redis import RedisStore
from conventions.store.redis_results import ResultWrite
from conventions.tracing import headers as hdr
from tasks import app
from tests.conftest import BROKER_DB
from tests.integration import support_jobs
from tests.integration.helpers import Monitor, dead_letter_of, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


@pytest.fixture
def call_id() -> Iterator[str]:
    yield f"call_{uuid.uuid4().hex[:10]}"


def meta(task_id: str) -> str:
    return f"celery-task-meta-{task_id}"


def events(correlation: str) -> list[str]:
    return [e.event for e in app.store.audit_for(correlation)]


def is_done(key: str) -> bool:
    """The ledger's answer, read by a claim that cannot take a finished key (``key`` of
    a ``testing.*`` job, namespaced here as the store keeps it)."""
    key = f"testing.{key.partition(':')[0]}:{key}"
    claim = app.store.claim(key, "probe", 1, f"probe-{uuid.uuid4().hex}")
    assert claim.status is not ClaimStatus.CLAIMED, f"{key} was free"
    return claim.status is ClaimStatus.DONE


def test_the_test_setup_rides_the_result_writes() -> None:
    assert isinstance(app.backend, results.RedisBackend)
    assert app.backend.store_alongside(app.store) is app.store


def test_started_and_success_ride_the_claim_and_the_completion(call_id: str) -> None:
    # a job first, so that the worker's scripts are loaded (on a fresh server, a NOSCRIPT
    # reply is followed by the same EVALSHA again)
    support_jobs.echo.delay(call_id=f"{call_id}-warm").get(timeout=30)
    correlation = f"corr-{call_id}"
    with Monitor() as monitor, bind(correlation_id=correlation):
        handle = support_jobs.echo.delay(call_id=call_id)
        assert handle.get(timeout=30)["key"] == f"echo:{call_id}"
    sent = monitor.top_level(meta(handle.id))
    # no client wrote the result (the caller's reads aside): the two scripts did
    assert [c for c in sent if c in ("SET", "SETEX", "PUBLISH", "EVALSHA")] == [
        "EVALSHA",
        "EVALSHA",
    ], sent
    # each script writes once, reading what it replaced (SET GET: a SUCCESS is never
    # overwritten), and publishes it
    assert sorted(monitor.scripted(meta(handle.id))) == ["PUBLISH", "PUBLISH", "SET", "SET"]
    assert events(correlation) == ["published", "started", "succeeded"]
    assert is_done(f"echo:{call_id}")


def test_neither_the_delay_nor_the_worker_reads_or_subscribes_and_a_later_get_finds_it(
    call_id: str, broker_redis: redis.Redis
) -> None:
    with Monitor() as monitor:
        handle = support_jobs.echo.delay(call_id=call_id)
        wait_for(lambda: broker_redis.exists(meta(handle.id)))  # ran and stored, unread
        wait_for(lambda: monitor.top_level(meta(handle.id)))  # the monitor saw that far
        before_get = monitor.top_level(meta(handle.id))
        assert handle.get(timeout=30)["key"] == f"echo:{call_id}"
    # no subscription at publish; no read before each write in the worker (the scripts
    # that carry the writes read the stored state themselves)
    assert "SUBSCRIBE" not in before_get, before_get
    assert "GET" not in before_get, before_get
    # the get subscribed (for a job still running) and read what was already stored
    assert "SUBSCRIBE" in monitor.top_level(meta(handle.id))


@pytest.mark.parametrize(("ttl", "commands"), [(None, ["GET"]), (3600, ["SET", "SET"])])
def test_a_riding_started_write_never_overwrites_a_stored_success(
    call_id: str, broker_redis: redis.Redis, ttl: int | None, commands: list[str]
) -> None:
    handle = support_jobs.echo.delay(call_id=call_id)
    assert handle.get(timeout=30)["key"] == f"echo:{call_id}"
    stored = broker_redis.get(meta(handle.id))
    # a redelivered copy of the finished job: its claim carries a STARTED write
    started = ResultWrite(meta(handle.id), '{"status": "STARTED"}', ttl, BROKER_DB)
    lifetime = broker_redis.ttl(meta(handle.id))
    key = f"testing.echo:echo:{call_id}"
    with Monitor() as monitor:
        claim = app.store.claim(key, "copy", 5, f"copy-{call_id}", result=started)
    assert claim.status is ClaimStatus.DONE
    assert broker_redis.get(meta(handle.id)) == stored
    # with an expiry, the write met the SUCCESS (SET GET) and put it back in the same
    # script; without, it read first; neither announced anything
    assert monitor.scripted(meta(handle.id)) == commands
    # put back, the SUCCESS lasts as the write would have; read first, as it did
    expected = lifetime if ttl is None else ttl
    assert 0 < expected - 5 <= broker_redis.ttl(meta(handle.id)) <= expected


def test_a_job_whose_result_is_ignored_completes_on_its_own(
    call_id: str, broker_redis: redis.Redis
) -> None:
    correlation = f"corr-{call_id}"
    with bind(correlation_id=correlation):
        handle = support_jobs.echo.apply_async(kwargs={"call_id": call_id}, ignore_result=True)
    wait_for(lambda: "succeeded" in events(correlation))
    assert is_done(f"echo:{call_id}")
    assert not broker_redis.exists(meta(handle.id))


def test_a_job_with_a_callback_completes_before_celery_dispatches_it(call_id: str) -> None:
    then, correlation = f"{call_id}_then", f"corr-{call_id}"
    with Monitor() as monitor, bind(correlation_id=correlation):
        handle = support_jobs.echo.apply_async(
            kwargs={"call_id": call_id}, link=support_jobs.echo.si(call_id=then)
        )
        handle.get(timeout=30)
    # Celery dispatches the callback before it writes SUCCESS: that write is its own
    assert "SETEX" in monitor.top_level(meta(handle.id))
    assert is_done(f"echo:{call_id}")
    # the callback runs in the job's story (it inherits the correlation id)
    wait_for(lambda: events(correlation).count("succeeded") == 2)
    assert is_done(f"echo:{then}")


def test_a_value_celery_cannot_store_is_a_bug_dead_letter_and_never_recorded_done(
    call_id: str,
) -> None:
    """One truth: the run history and Celery both say it failed (it used to be
    ``succeeded`` in the ledger and FAILURE, an EncodeError, in Celery)."""
    correlation = f"corr-{call_id}"
    with bind(correlation_id=correlation):
        handle = support_jobs.unstorable.delay(call_id=call_id)
    wait_for(lambda: handle.state == "FAILURE")
    record = wait_for(lambda: dead_letter_of(handle.id))
    assert record.category is Category.BUG
    assert "cannot be stored as the job's result" in record.message
    assert "dead_lettered" in events(correlation)
    assert "succeeded" not in events(correlation)
    ledger = app.store.key_state(f"testing.unstorable:unstorable:{call_id}").ledger_state
    assert ledger != "succeeded"  # the claim given up: a replay after the fix runs
    run = wait_for(lambda: app.store.get_run(handle.id))
    assert run.state == "dead_lettered"


def test_a_result_is_written_in_the_backends_database(broker_redis: redis.Redis) -> None:
    store = app.store
    assert isinstance(store, RedisStore) and store.database != BROKER_DB
    key, result = f"riding-{uuid.uuid4().hex}", f"result-{uuid.uuid4().hex}"
    write = ResultWrite(key, '{"status": "STARTED"}', 60, BROKER_DB)
    claim = store.claim(key, "owner", 5, f"d-{key}", result=write)
    assert claim.status is ClaimStatus.CLAIMED
    assert broker_redis.get(key) == '{"status": "STARTED"}'
    assert 0 < broker_redis.ttl(key) <= 60
    store.complete(
        key, "owner", "succeeded", 60, None, result=ResultWrite(key, result, None, BROKER_DB)
    )
    assert broker_redis.get(key) == result and broker_redis.ttl(key) == -1
    assert store.client.get(key) is None  # nothing written in the store's own database
    assert store.claim(key, "other", 5, f"d2-{key}").status is ClaimStatus.DONE
    broker_redis.delete(key)


def test_a_retried_completion_records_its_event_once() -> None:
    """A completion whose reply was lost is sent again (Celery retries a result write on a
    lost connection): the second one finds the key done by the same owner."""
    store = app.store
    key, correlation = f"retried-{uuid.uuid4().hex}", f"corr-{uuid.uuid4().hex}"
    headers = {hdr.CORRELATION: correlation}
    succeeded = audit.event("succeeded", "testing.echo.v1", "job-1", headers, attempt=1)
    store.claim(key, "owner", 5, f"d-{key}")
    store.complete(key, "owner", "succeeded", 60, None, audit=succeeded)
    store.complete(key, "owner", "succeeded", 60, None, audit=succeeded)
    assert events(correlation) == ["succeeded"]
