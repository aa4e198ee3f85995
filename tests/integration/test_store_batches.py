"""The batches part of the store contract, on Redis, Redis Cluster, PostgreSQL and
SQLite: a member moves once per outcome, members ending at once from many threads make
the callbacks due exactly once, a replayed member fires ``on_success``, a nested batch
moves its parent, and a due callback stays listed until it is marked sent.

On the cluster a batch tree's keys are in its root's slot, and so are a member's job
keys while it runs (``keys.batch_home``): its completion and its dead letter move the
batch in one script (the last two tests).
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from conventions.store import Store, keys
from conventions.store import batches as b
from conventions.store.records import ClaimStatus
from tests.integration.test_store_contract import (  # noqa: F401  (fixtures)
    cluster_backend,
    dead_letter,
    postgresql_backend,
    redis_backend,
    sqlite_backend,
)
from tests.integration.test_store_contract import (
    store as contract_store,
)

#: the contract's fixture: an empty store on each of its four backends, wiped after
store = contract_store

CALLBACKS = {b.ON_SUCCESS: {"task": "t.ok.v1"}, b.ON_COMPLETE: {"task": "t.done.v1"}}


def _batch(store: Store, members: int, parent: str | None = None, nested: str = "") -> str:
    batch_id = f"b-{uuid.uuid4().hex[:8]}"
    names = [f"m{n}" for n in range(members)] + ([b.nested_member(nested)] if nested else [])
    assert store.create_batch(b.BatchSpec(batch_id, tuple(names), CALLBACKS, parent))
    return batch_id


def _end(store: Store, chain: tuple[str, ...], member: str, outcome: str) -> list[str]:
    dead = f"dl-{member}" if outcome == b.FAILED else ""
    return store.end_member(b.BatchMove(chain, member, outcome, f"job-{member}", dead))


def test_a_batch_is_made_once_and_a_member_moves_once_per_outcome(store: Store) -> None:
    batch_id = _batch(store, 2)
    assert not store.create_batch(b.BatchSpec(batch_id, ("other",), {}))
    assert _end(store, (batch_id,), "m0", b.SUCCEEDED) == []
    assert _end(store, (batch_id,), "m0", b.SUCCEEDED) == []  # again: nothing moves
    assert _end(store, (batch_id,), "m0", b.FAILED) == []  # a late failure of a copy
    assert _end(store, (batch_id,), "nobody", b.SUCCEEDED) == []  # not a member
    status = store.get_batch(batch_id)
    assert status is not None
    assert (status.pending, status.succeeded, status.failed) == (1, 1, 0)
    assert status.members["m0"] == (b.SUCCEEDED, "job-m0", "")
    assert status.callback_states == {b.ON_SUCCESS: b.WAITING, b.ON_COMPLETE: b.WAITING}


def test_members_ending_at_once_make_each_callback_due_exactly_once(store: Store) -> None:
    batch_id = _batch(store, 120)
    members = [f"m{n}" for n in range(120)] * 2  # each one ends twice, concurrently
    with ThreadPoolExecutor(max_workers=8) as pool:
        fired = list(pool.map(lambda m: _end(store, (batch_id,), m, b.SUCCEEDED), members))
    due = sorted(item for items in fired for item in items)
    assert due == sorted([f"{batch_id}|{b.ON_SUCCESS}", f"{batch_id}|{b.ON_COMPLETE}"])
    status = store.get_batch(batch_id)
    assert status is not None and (status.pending, status.succeeded) == (0, 120)
    assert status.ended_at is not None


def test_a_failed_member_replayed_fires_on_success_once_and_on_complete_never_again(
    store: Store,
) -> None:
    batch_id = _batch(store, 2)
    _end(store, (batch_id,), "m0", b.SUCCEEDED)
    assert _end(store, (batch_id,), "m1", b.FAILED) == [f"{batch_id}|{b.ON_COMPLETE}"]
    status = store.get_batch(batch_id)
    assert status is not None and status.dead_letter_ids == ["dl-m1"]
    store.callback_sent(batch_id, b.ON_COMPLETE)
    assert _end(store, (batch_id,), "m1", b.SUCCEEDED) == [f"{batch_id}|{b.ON_SUCCESS}"]
    assert _end(store, (batch_id,), "m1", b.SUCCEEDED) == []
    status = store.get_batch(batch_id)
    assert status is not None and (status.succeeded, status.failed) == (2, 0)
    assert status.callback_states == {b.ON_SUCCESS: b.DUE, b.ON_COMPLETE: b.SENT}


def test_a_nested_batch_moves_its_parent_when_it_ends_and_again_when_replayed(
    store: Store,
) -> None:
    child = f"c-{uuid.uuid4().hex[:8]}"
    parent = _batch(store, 1, nested=child)
    assert store.create_batch(b.BatchSpec(child, ("x",), CALLBACKS, parent))
    _end(store, (parent,), "m0", b.SUCCEEDED)
    fired = _end(store, (child, parent), "x", b.FAILED)
    assert sorted(fired) == sorted([f"{child}|{b.ON_COMPLETE}", f"{parent}|{b.ON_COMPLETE}"])
    outer = store.get_batch(parent)
    assert outer is not None and outer.members[b.nested_member(child)][0] == b.FAILED
    fired = _end(store, (child, parent), "x", b.SUCCEEDED)
    assert sorted(fired) == sorted([f"{child}|{b.ON_SUCCESS}", f"{parent}|{b.ON_SUCCESS}"])
    outer = store.get_batch(parent)
    assert outer is not None and (outer.succeeded, outer.failed) == (2, 0)


def test_a_due_callback_is_listed_for_the_sweep_until_it_is_marked_sent(store: Store) -> None:
    batch_id = _batch(store, 1)
    _end(store, (batch_id,), "m0", b.SUCCEEDED)
    due = store.due_callbacks(0)
    assert sorted(due) == sorted([f"{batch_id}|{b.ON_SUCCESS}", f"{batch_id}|{b.ON_COMPLETE}"])
    assert store.due_callbacks(3600) == []  # not due for an hour yet
    store.callback_sent(batch_id, b.ON_SUCCESS)
    assert store.due_callbacks(0) == [f"{batch_id}|{b.ON_COMPLETE}"]
    assert [found.id for found in store.list_batches()] == [batch_id]


def test_retention_purges_the_ended_batches_only(store: Store) -> None:
    from datetime import timedelta

    from conventions.store.records import utcnow

    ended, running, due = _batch(store, 1), _batch(store, 1), _batch(store, 1)
    _end(store, (ended,), "m0", b.SUCCEEDED)
    for which in b.CALLBACKS:
        store.callback_sent(ended, which)
    _end(store, (due,), "m0", b.SUCCEEDED)  # its callbacks are due, not sent yet
    assert store.purge_batches(utcnow() - timedelta(hours=1)) == 0  # ended just now
    assert store.purge_batches(utcnow() + timedelta(seconds=5)) == 1
    assert store.get_batch(ended) is None
    assert store.get_batch(running) is not None and store.get_batch(due) is not None
    assert sorted(found.id for found in store.list_batches()) == sorted([running, due])


def test_a_members_claim_and_completion_end_it_in_its_batch_in_its_slot(store: Store) -> None:
    """The job path of a member: its reservation, claim and completion (with the move)
    in its batch's home; on the cluster every key of that script is in one slot (a
    CROSSSLOT error otherwise)."""
    child = f"c-{uuid.uuid4().hex[:8]}"
    parent = _batch(store, 0, nested=child)
    spec = b.BatchSpec(child, ("t.item:one", "t.item:two"), CALLBACKS, parent, parent)
    assert store.create_batch(spec)
    for n, member in enumerate(("t.item:one", "t.item:two")):
        with keys.batch_home(member, parent):
            assert store.reserve(member, f"job-{n}", 60) is None
            assert store.claim(member, f"run-{n}", 60, f"job-{n}").status is ClaimStatus.CLAIMED
            fired = store.complete(
                member, f"run-{n}", "ok", 60, f"job-{n}",
                batch=b.BatchMove((child, parent), member, b.SUCCEEDED, f"job-{n}"),
            )  # fmt: skip
            assert store.claim(member, f"run-{n}b", 60, f"job-{n}").status is ClaimStatus.DONE
    assert sorted(fired) == sorted(f"{i}|{w}" for i in (child, parent) for w in b.CALLBACKS)
    for batch_id in (child, parent):
        status = store.get_batch(batch_id)
        assert status is not None and (status.pending, status.failed) == (0, 0)
    assert status is not None
    assert status.succeeded == 1  # the nested batch, one member of its parent


def test_a_members_dead_letter_ends_it_in_its_batch_and_is_found_by_its_id(store: Store) -> None:
    batch_id = _batch(store, 1)
    member = "m0"
    record_id = keys.id_in_partition(keys.batch_source(batch_id), lambda: uuid.uuid4().hex)
    record = dead_letter(record_id)
    with keys.batch_home(member, batch_id):
        fired = store.put_dead_letter(
            record, batch=b.BatchMove((batch_id,), member, b.FAILED, "job-m0", record_id)
        )
    assert fired == [f"{batch_id}|{b.ON_COMPLETE}"]
    found = store.get_dead_letter(record_id)
    assert found is not None and found.id == record_id
    status = store.get_batch(batch_id)
    assert status is not None and status.dead_letter_ids == [record_id]
