# ruff: noqa: F811  (the contract suite's fixtures, imported by name)
"""The store contract for named leases and state documents, on every backend.

The backends are the contract suite's own (``test_store_contract``): a random Redis
prefix, random PostgreSQL tables, a SQLite file; wiped after every test.
"""

from __future__ import annotations

import time

from conventions.store import Store
from tests.integration.test_store_contract import (  # noqa: F401  (fixtures)
    LEASE,
    LONG,
    PAST_LEASE,
    at_once,
    cluster_backend,
    postgresql_backend,
    redis_backend,
    sqlite_backend,
    store,
)


def test_a_free_lease_is_taken(store: Store) -> None:
    assert store.acquire("lock:order:1", "a", LONG) is None
    assert store.lease_holder("lock:order:1") == "a"


def test_a_held_lease_answers_its_holder(store: Store) -> None:
    store.acquire("lock:order:1", "a", LONG)
    assert store.acquire("lock:order:1", "b", LONG) == "a"


def test_the_holder_acquiring_again_extends_its_lease(store: Store) -> None:
    store.acquire("lock:order:1", "a", LEASE)
    assert store.acquire("lock:order:1", "a", LONG) is None
    time.sleep(PAST_LEASE)
    assert store.acquire("lock:order:1", "b", LONG) == "a"


def test_an_expired_lease_goes_to_the_next_owner(store: Store) -> None:
    store.acquire("lock:order:1", "a", LEASE)
    time.sleep(PAST_LEASE)
    assert store.lease_holder("lock:order:1") is None
    assert store.acquire("lock:order:1", "b", LONG) is None
    assert not store.renew_lease("lock:order:1", "a", LONG)


def test_fifty_concurrent_acquires_give_exactly_one_lease(store: Store) -> None:
    answers = at_once(50, lambda i: store.acquire("lock:order:1", f"owner-{i}", LONG))
    assert answers.count(None) == 1


def test_renew_keeps_the_lease_past_its_first_ttl(store: Store) -> None:
    store.acquire("lock:order:1", "a", LEASE)
    assert store.renew_lease("lock:order:1", "a", LONG)
    time.sleep(PAST_LEASE)
    assert store.acquire("lock:order:1", "b", LONG) == "a"


def test_only_the_holder_releases_a_lease(store: Store) -> None:
    store.acquire("lock:order:1", "a", LONG)
    assert not store.release_lease("lock:order:1", "b")
    assert not store.renew_lease("lock:order:1", "b", LONG)
    assert store.release_lease("lock:order:1", "a")
    assert store.acquire("lock:order:1", "b", LONG) is None


def test_a_state_document_is_read_back_until_deleted(store: Store) -> None:
    assert store.get_state("checkpoint:report:1") is None
    store.put_state("checkpoint:report:1", {"cursor": 200, "note": "rows"}, None)
    store.put_state("checkpoint:report:1", {"cursor": 400, "note": "rows"}, None)
    assert store.get_state("checkpoint:report:1") == {"cursor": 400, "note": "rows"}
    store.delete_state("checkpoint:report:1")
    assert store.get_state("checkpoint:report:1") is None


def test_a_state_document_with_a_ttl_expires(store: Store) -> None:
    store.put_state("progress:task-1", {"done": 1}, LEASE)
    assert store.get_state("progress:task-1") == {"done": 1}
    time.sleep(PAST_LEASE)
    assert store.get_state("progress:task-1") is None
