"""The Redis store's done entries: compact, in day buckets, and the old layout still read
(``conventions.store.redis_done``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis

from conventions.store import keys
from conventions.store.records import ClaimStatus, utcnow
from conventions.store.redis import RedisStore

#: a keep no test outlives
LONG = 3600.0
#: the budget of what a finished job leaves for the whole keep (issue #32)
BYTES_PER_DONE_JOB = 100


@pytest.fixture
def store(store_redis: redis.Redis) -> Iterator[RedisStore]:
    store = RedisStore(store_redis, prefix=f"cc-done-{uuid.uuid4().hex}:")
    yield store
    for name in store_redis.scan_iter(match=keys.pattern(store.prefix), count=1000):
        store_redis.delete(name)


def _finish(store: RedisStore, key: str, owner: str = "a" * 32) -> None:
    store.claim(key, owner, 60, f"{key}:0")
    store.complete(
        key, owner, "succeeded", LONG, None, fingerprint="v1:0123456789abcdef",
        delivery_id=f"{key}:0",
    )  # fmt: skip


def test_a_finished_job_leaves_under_100_bytes_for_its_keep(store: RedisStore) -> None:
    client = store.client
    # past the bucket's small encoding, as a fleet's day holds it
    jobs = 3000
    # one job first: the scripts it loads into a fresh server's cache, and Lua's memory
    # with them (about 100 bytes per job of this run on a fresh server), are not the jobs'
    # bytes
    _finish(store, "receipts.send:warm-up", owner=uuid.uuid4().hex)
    before = int(client.info("memory")["used_memory"])
    for n in range(jobs):
        _finish(store, f"receipts.send:order:{n:06d}", owner=uuid.uuid4().hex)
    per_job = (int(client.info("memory")["used_memory"]) - before) / jobs
    assert per_job < BYTES_PER_DONE_JOB, f"{per_job:.0f} bytes per finished job"
    claim = store.claim("receipts.send:order:000042", "b" * 32, 60, "late:0")
    assert (claim.status, claim.fingerprint) == (ClaimStatus.DONE, "v1:0123456789abcdef")


def test_the_completion_drops_the_running_lease_and_the_delivery_counter(
    store: RedisStore,
) -> None:
    _finish(store, "charge:1")
    left = {name.removeprefix(store.prefix) for name in store.client.scan_iter(
        match=keys.pattern(store.prefix))}  # fmt: skip
    assert left and all(name.startswith("done:") for name in left), left


def test_keys_show_reads_a_done_key_with_its_owner_outcome_and_expiry(store: RedisStore) -> None:
    store.claim("charge:1", "exec-a", 60, "d-1")
    store.complete("charge:1", "exec-a", "charged", LONG, None)
    state = store.key_state("charge:1")
    assert (state.ledger_state, state.ledger_owner, state.ledger_outcome) == (
        "done", "exec-a", "charged",
    )  # fmt: skip
    assert state.ledger_until is not None
    assert store.clear_key("charge:1").ledger_state == "done"
    assert store.key_state("charge:1").ledger_state is None
    assert store.claim("charge:1", "exec-b", 60, "d-2").status is ClaimStatus.CLAIMED


def test_a_done_entry_of_the_old_layout_still_answers_done(store: RedisStore) -> None:
    """A fleet upgrading keeps a week of ledger in the form the release before wrote."""
    old = keys.ledger("charge:1", store.prefix)
    store.client.hset(old, mapping={"state": "done", "owner": "exec-old", "outcome": "charged",
                                    "print": "v1:aaaa"})  # fmt: skip
    store.client.pexpire(old, int(LONG * 1000))
    claim = store.claim("charge:1", "exec-b", 60, "d-2")
    assert (claim.status, claim.holder, claim.outcome, claim.fingerprint) == (
        ClaimStatus.DONE, "exec-old", "charged", "v1:aaaa",
    )  # fmt: skip
    store.complete("charge:1", "exec-old", "charged", LONG, None)  # a replay: nothing moves
    assert store.client.hget(old, "state") == "done"
    assert store.key_state("charge:1").ledger_owner == "exec-old"
    store.clear_key("charge:1")
    assert store.claim("charge:1", "exec-c", 60, "d-3").status is ClaimStatus.CLAIMED


def test_a_replayed_completion_by_the_same_owner_changes_nothing(store: RedisStore) -> None:
    owner = uuid.uuid4().hex
    _finish(store, "charge:1", owner=owner)
    store.complete("charge:1", owner, "succeeded", LONG, None, fingerprint="v1:ffffffffffffffff")
    assert store.claim("charge:1", "x", 60, "d").fingerprint == "v1:0123456789abcdef"


def test_a_keep_beyond_the_horizon_is_cut_to_the_last_bucket_readers_see(
    store_redis: redis.Redis,
) -> None:
    store = RedisStore(store_redis, prefix=f"cc-done-{uuid.uuid4().hex}:", done_horizon=86400)
    try:
        store.claim("charge:1", "exec-a", 60, "d-1")
        store.complete("charge:1", "exec-a", "succeeded", 30 * 86400, None)
        assert store.claim("charge:1", "exec-b", 60, "d-2").status is ClaimStatus.DONE
        until = store.key_state("charge:1").ledger_until
        assert until is not None and until < utcnow() + timedelta(days=3)
    finally:
        for name in store_redis.scan_iter(match=keys.pattern(store.prefix)):
            store_redis.delete(name)
