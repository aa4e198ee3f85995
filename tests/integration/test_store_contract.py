"""The store contract, run against real Redis, Redis Cluster, PostgreSQL and SQLite.

One suite, four backends (the cluster: three masters of the session's own,
``redis_cluster`` in ``tests/fixtures.py``): every test runs once per backend, so the
backends cannot drift apart. Each run gets its own isolated storage (a random Redis key
prefix, random PostgreSQL table names, a new SQLite file), emptied after every test and
removed at the end. Leases are fractions of a second so that expiry is real and the
file stays fast. Override the services with ``TEST_REDIS_URL`` and
``TEST_POSTGRES_URL``; a service that does not answer is skipped on a laptop and fails
in CI.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import sqlalchemy as sa

from conventions.store import (
    RedisStore,
    SQLStore,
    Store,
    keys,
    open_store,
    redis_records,
    resolve_url,
)
from conventions.store.records import AuditEvent, Category, Claim, ClaimStatus, DeadLetter
from conventions.store.sql import make_engine
from tests.conftest import REDIS_BASE
from tests.fixtures import unavailable

#: database 15 of the test worker's Redis (tests/conftest.py)
REDIS_URL = f"{REDIS_BASE}/15"
POSTGRES_URL = os.environ.get(
    "TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

#: a lease short enough to watch expire, long enough to outlive the calls made under it
LEASE = 0.1
#: comfortably past one LEASE
PAST_LEASE = 0.15
#: a lease nobody outlives during a test
LONG = 30.0

T = TypeVar("T")


# -- backends -------------------------------------------------------------------------------
# One store per backend and test module (a random Redis prefix, random PostgreSQL table
# names, one SQLite file), wiped after every test and removed at the end.


@pytest.fixture(scope="module")
def redis_backend() -> Iterator[RedisStore]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        client.close()
        unavailable(f"Redis at {REDIS_URL}", exc)
    store = RedisStore(client, prefix=f"cc-test-{uuid.uuid4().hex}:")
    try:
        yield store
    finally:
        _wipe_redis(store)
        store.close()
        client.close()


@pytest.fixture(scope="module")
def cluster_backend(redis_cluster: Any) -> Iterator[RedisStore]:
    """The Redis store on a three-master Redis Cluster, opened from its URL."""
    from tests.integration import support_cluster

    store = RedisStore(
        support_cluster.url(redis_cluster.ports), prefix=f"cc-test-{uuid.uuid4().hex}:"
    )
    try:
        yield store
    finally:
        _wipe_redis(store)
        store.close()


@pytest.fixture(scope="module")
def postgresql_backend() -> Iterator[SQLStore]:
    engine = make_engine(POSTGRES_URL)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        engine.dispose()
        unavailable(f"PostgreSQL at {POSTGRES_URL}", exc)
    store = SQLStore(engine, table_prefix=f"cc_test_{uuid.uuid4().hex[:12]}_")
    try:
        yield store
    finally:
        store.close()
        store.metadata.drop_all(engine)
        engine.dispose()


@pytest.fixture(scope="module")
def sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQLStore]:
    store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('store') / 'store.db'}")
    try:
        yield store
    finally:
        store.close()


def _wipe_redis(store: RedisStore) -> None:
    for key in store.client.scan_iter(match=keys.pattern(store.prefix), count=1000):
        store.client.delete(key)  # on a cluster, SCAN visits every master


def _wipe_sql(store: SQLStore) -> None:
    with store.engine.begin() as conn:
        for table in store.metadata.sorted_tables:
            conn.execute(table.delete())


@pytest.fixture(params=["redis", "cluster", "postgresql", "sqlite"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """An empty store on each backend, wiped again after the test."""
    backend = request.getfixturevalue(f"{request.param}_backend")
    try:
        yield backend
    finally:
        if isinstance(backend, RedisStore):
            _wipe_redis(backend)
        else:
            _wipe_sql(backend)


def at_once(count: int, call: Callable[[int], T]) -> list[T]:
    """Run ``call(0..count-1)`` on ``count`` real threads released together."""
    barrier = threading.Barrier(count)

    def run(i: int) -> T:
        barrier.wait()
        return call(i)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(run, range(count)))


BASE = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def dead_letter(
    record_id: str,
    minutes: int = 0,
    task: str = "billing.charge.v1",
    category: Category = Category.PERMANENT,
) -> DeadLetter:
    """A dead letter that last failed ``minutes`` after BASE."""
    return DeadLetter(
        id=record_id,
        task=task,
        task_id=f"task-{record_id}",
        category=category,
        payload={"order_id": 42},
        headers={"correlation_id": "corr-1"},
        idempotency_key=f"charge:{record_id}",
        exc_type="CardDeclined",
        message="card declined",
        traceback="Traceback (most recent call last): ...",
        attempts=3,
        first_failed_at=BASE,
        last_failed_at=BASE + timedelta(minutes=minutes),
        worker="worker-1@host",
        queue="billing",
        correlation_id="corr-1",
    )


def audit_event(correlation_id: str, name: str, minutes: int, **detail: Any) -> AuditEvent:
    return AuditEvent(
        event=name,
        task="billing.charge.v1",
        task_id="task-1",
        correlation_id=correlation_id,
        at=BASE + timedelta(minutes=minutes),
        detail=detail,
    )


# -- enqueue dedup ---------------------------------------------------------------------------
def test_a_first_reservation_is_ours(store: Store) -> None:
    assert store.reserve("order:1", "job-a", LONG) is None


def test_a_second_reservation_returns_the_first_job_id(store: Store) -> None:
    store.reserve("order:1", "job-a", LONG)
    assert store.reserve("order:1", "job-b", LONG) == "job-a"


def test_the_same_job_reserving_again_is_told_the_reservation_is_its_own(store: Store) -> None:
    store.reserve("order:1", "job-a", LONG)
    assert store.reserve("order:1", "job-a", LONG) is None


def test_an_expired_reservation_goes_to_the_next_job(store: Store) -> None:
    store.reserve("order:1", "job-a", LEASE)
    time.sleep(PAST_LEASE)
    assert store.reserve("order:1", "job-b", LONG) is None
    assert store.reserve("order:1", "job-c", LONG) == "job-b"


def test_a_reservation_without_ttl_lasts_until_unreserved(store: Store) -> None:
    store.reserve("order:1", "job-a", None)
    time.sleep(PAST_LEASE)
    assert store.reserve("order:1", "job-b", None) == "job-a"
    store.unreserve("order:1", "job-a")
    assert store.reserve("order:1", "job-b", None) is None


def test_unreserve_by_another_job_keeps_the_reservation(store: Store) -> None:
    store.reserve("order:1", "job-a", LONG)
    store.unreserve("order:1", "job-b")
    assert store.reserve("order:1", "job-c", LONG) == "job-a"


def test_fifty_concurrent_reservations_give_exactly_one(store: Store) -> None:
    answers = at_once(50, lambda i: store.reserve("order:1", f"job-{i}", LONG))
    winners = [f"job-{i}" for i, holder in enumerate(answers) if holder is None]
    assert len(winners) == 1
    assert {holder for holder in answers if holder is not None} == set(winners)


# -- one key, for operators ------------------------------------------------------------------
def test_key_state_shows_the_reservation_and_the_ledger_entry(store: Store) -> None:
    assert store.key_state("order:9").empty
    store.reserve("order:9", "job-a", LONG)
    store.claim("order:9", "run-a", LONG, "job-a")
    state = store.key_state("order:9")
    assert (state.reserved_by, state.ledger_state, state.ledger_owner) == ("job-a", "running",
                                                                          "run-a")  # fmt: skip
    assert state.reserved_until is not None and state.ledger_until is not None
    assert state.reserved_until > datetime.now(UTC) + timedelta(seconds=LONG / 2)
    store.complete("order:9", "run-a", "sent", LONG, "job-a")
    done = store.key_state("order:9")
    assert (done.reserved_by, done.ledger_state, done.ledger_outcome) == (None, "done", "sent")


def test_key_state_forgets_what_expired(store: Store) -> None:
    store.reserve("order:9", "job-a", LEASE)
    store.claim("order:9", "run-a", LEASE, "job-a")
    time.sleep(PAST_LEASE)
    assert store.key_state("order:9").empty


def test_clear_key_drops_both_whoever_holds_them_and_records_its_event(store: Store) -> None:
    store.reserve("order:9", "job-a", None)
    store.claim("order:9", "run-a", LONG, "job-a")
    cleared = store.clear_key("order:9", audit=audit_event("corr-k", "key_cleared", 0))
    assert (cleared.reserved_by, cleared.ledger_owner) == ("job-a", "run-a")
    assert store.key_state("order:9").empty
    assert store.reserve("order:9", "job-b", LONG) is None
    assert store.claim("order:9", "run-b", LONG, "job-b").status is ClaimStatus.CLAIMED
    assert [e.event for e in store.audit_for("corr-k")] == ["key_cleared"]
    assert store.clear_key("order:unknown").empty


# -- execution ledger ------------------------------------------------------------------------
def test_a_free_key_is_claimed_and_counts_the_first_delivery(store: Store) -> None:
    assert store.claim("charge:1", "exec-a", LONG, "delivery-1") == Claim(
        ClaimStatus.CLAIMED, holder="exec-a", deliveries=1
    )


def test_a_live_lease_answers_held_with_its_holder(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    claim = store.claim("charge:1", "exec-b", LONG, "delivery-2")
    assert (claim.status, claim.holder) == (ClaimStatus.HELD, "exec-a")


def test_fifty_concurrent_claims_give_exactly_one_claim(store: Store) -> None:
    claims = at_once(50, lambda i: store.claim("charge:1", f"exec-{i}", LONG, "delivery-1"))
    claimed = [claim for claim in claims if claim.status is ClaimStatus.CLAIMED]
    assert len(claimed) == 1
    assert claimed[0].deliveries == 1
    held = [claim for claim in claims if claim.status is ClaimStatus.HELD]
    assert len(held) == 49
    assert {claim.holder for claim in held} == {claimed[0].holder}


def test_an_expired_lease_is_taken_over_and_counts_a_delivery(store: Store) -> None:
    store.claim("charge:1", "exec-a", LEASE, "delivery-1")
    time.sleep(PAST_LEASE)
    assert store.claim("charge:1", "exec-b", LONG, "delivery-1") == Claim(
        ClaimStatus.CLAIMED, holder="exec-b", deliveries=2
    )


def test_fifty_concurrent_takeovers_of_an_expired_lease_give_exactly_one_claim(
    store: Store,
) -> None:
    store.claim("charge:1", "exec-dead", LEASE, "delivery-1")
    time.sleep(PAST_LEASE)
    claims = at_once(50, lambda i: store.claim("charge:1", f"exec-{i}", LONG, "delivery-1"))
    claimed = [claim for claim in claims if claim.status is ClaimStatus.CLAIMED]
    assert len(claimed) == 1
    assert claimed[0].deliveries == 2


def test_deliveries_are_counted_per_delivery_id(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.release("charge:1", "exec-a", None)
    assert store.claim("charge:1", "exec-b", LONG, "delivery-2").deliveries == 1
    store.release("charge:1", "exec-b", None)
    assert store.claim("charge:1", "exec-c", LONG, "delivery-1").deliveries == 2


def test_a_done_key_answers_done_with_its_outcome(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.complete("charge:1", "exec-a", "charged", LONG, None)
    assert store.claim("charge:1", "exec-b", LONG, "delivery-2") == Claim(
        ClaimStatus.DONE, holder="exec-a", outcome="charged"
    )


def test_a_done_key_is_free_again_after_keep(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.complete("charge:1", "exec-a", "charged", LEASE, None)
    time.sleep(PAST_LEASE)
    assert store.claim("charge:1", "exec-b", LONG, "delivery-2").status is ClaimStatus.CLAIMED


def test_renew_extends_the_owners_lease(store: Store) -> None:
    store.claim("charge:1", "exec-a", LEASE, "delivery-1")
    assert store.renew("charge:1", "exec-a", LONG)
    time.sleep(PAST_LEASE)
    assert store.claim("charge:1", "exec-b", LONG, "delivery-1").status is ClaimStatus.HELD


def test_renew_fails_for_a_stranger(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    assert not store.renew("charge:1", "exec-b", LONG)


def test_renew_fails_once_the_lease_expired(store: Store) -> None:
    store.claim("charge:1", "exec-a", LEASE, "delivery-1")
    time.sleep(PAST_LEASE)
    assert not store.renew("charge:1", "exec-a", LONG)


def test_renew_fails_on_a_done_key(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.complete("charge:1", "exec-a", "charged", LONG, None)
    assert not store.renew("charge:1", "exec-a", LONG)


def test_complete_drops_the_reservation(store: Store) -> None:
    store.reserve("charge:1", "job-a", LONG)
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.complete("charge:1", "exec-a", "charged", LONG, "job-a")
    assert store.reserve("charge:1", "job-b", LONG) is None


def test_complete_keeps_the_reservation_of_another_job(store: Store) -> None:
    store.reserve("charge:1", "job-b", LONG)
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.complete("charge:1", "exec-a", "charged", LONG, "job-a")
    assert store.reserve("charge:1", "job-c", LONG) == "job-b"


def test_complete_after_the_lease_expired_still_records_done(store: Store) -> None:
    store.claim("charge:1", "exec-a", LEASE, "delivery-1")
    time.sleep(PAST_LEASE)
    store.complete("charge:1", "exec-a", "charged", LONG, None)
    claim = store.claim("charge:1", "exec-b", LONG, "delivery-2")
    assert (claim.status, claim.outcome) == (ClaimStatus.DONE, "charged")


def test_complete_by_a_stranger_leaves_a_live_lease_alone(store: Store) -> None:
    store.claim("charge:1", "exec-a", LEASE, "delivery-1")
    time.sleep(PAST_LEASE)
    store.claim("charge:1", "exec-b", LONG, "delivery-1")
    store.complete("charge:1", "exec-a", "charged", LONG, None)
    claim = store.claim("charge:1", "exec-c", LONG, "delivery-2")
    assert (claim.status, claim.holder) == (ClaimStatus.HELD, "exec-b")


def test_release_frees_the_key_and_the_reservation(store: Store) -> None:
    store.reserve("charge:1", "job-a", LONG)
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.release("charge:1", "exec-a", "job-a")
    assert store.claim("charge:1", "exec-b", LONG, "delivery-2").status is ClaimStatus.CLAIMED
    assert store.reserve("charge:1", "job-b", LONG) is None


def test_release_by_a_stranger_changes_nothing(store: Store) -> None:
    store.reserve("charge:1", "job-a", LONG)
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.release("charge:1", "exec-b", "job-b")
    assert store.claim("charge:1", "exec-c", LONG, "delivery-2").holder == "exec-a"
    assert store.reserve("charge:1", "job-c", LONG) == "job-a"


def test_release_leaves_a_done_key_done(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "delivery-1")
    store.complete("charge:1", "exec-a", "charged", LONG, None)
    store.release("charge:1", "exec-a", None)
    assert store.claim("charge:1", "exec-b", LONG, "delivery-2").status is ClaimStatus.DONE


# -- dead letters ----------------------------------------------------------------------------
def test_a_dead_letter_comes_back_as_it_was_put(store: Store) -> None:
    record = dead_letter("dl-1")
    store.put_dead_letter(record)
    assert store.get_dead_letter("dl-1") == record
    assert store.get_dead_letter("dl-unknown") is None


def test_putting_the_same_id_again_overwrites_and_reindexes(store: Store) -> None:
    store.put_dead_letter(dead_letter("dl-1", task="old.task.v1", category=Category.BUG))
    replayed = dead_letter("dl-1", minutes=5, category=Category.EXHAUSTED)
    store.put_dead_letter(replayed)
    assert store.get_dead_letter("dl-1") == replayed
    assert store.count_dead_letters() == 1
    assert store.list_dead_letters(task="old.task.v1") == []
    assert store.list_dead_letters(category=Category.BUG) == []
    assert store.list_dead_letters(category=Category.EXHAUSTED) == [replayed]


def test_dead_letters_are_listed_newest_first(store: Store) -> None:
    for minutes in (5, 1, 9, 3):
        store.put_dead_letter(dead_letter(f"dl-{minutes}", minutes=minutes))
    assert [r.id for r in store.list_dead_letters()] == ["dl-9", "dl-5", "dl-3", "dl-1"]
    assert [r.id for r in store.list_dead_letters(limit=2)] == ["dl-9", "dl-5"]


def test_dead_letters_filter_by_task_category_and_since(store: Store) -> None:
    store.put_dead_letter(dead_letter("a", 1, task="billing.charge.v1", category=Category.BUG))
    store.put_dead_letter(dead_letter("b", 2, task="billing.refund.v1", category=Category.BUG))
    store.put_dead_letter(dead_letter("c", 3, task="billing.charge.v1"))
    store.put_dead_letter(dead_letter("d", 4, task="billing.charge.v1", category=Category.BUG))

    def ids(**filters: Any) -> list[str]:
        return [record.id for record in store.list_dead_letters(**filters)]

    assert ids(task="billing.charge.v1") == ["d", "c", "a"]
    assert ids(category=Category.BUG) == ["d", "b", "a"]
    assert ids(task="billing.charge.v1", category=Category.BUG) == ["d", "a"]
    assert ids(since=BASE + timedelta(minutes=2)) == ["d", "c", "b"]
    assert ids(task="billing.charge.v1", category=Category.BUG, since=BASE) == ["d", "a"]
    assert ids(task="billing.unknown.v1") == []


def test_count_and_delete_dead_letters(store: Store) -> None:
    assert store.count_dead_letters() == 0
    store.put_dead_letter(dead_letter("dl-1"))
    store.put_dead_letter(dead_letter("dl-2", minutes=1))
    assert store.count_dead_letters() == 2
    assert store.delete_dead_letter("dl-1")
    assert not store.delete_dead_letter("dl-1")
    assert store.get_dead_letter("dl-1") is None
    assert [r.id for r in store.list_dead_letters(task="billing.charge.v1")] == ["dl-2"]
    assert store.count_dead_letters() == 1


def test_purge_dead_letters_drops_only_the_older_records(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_records, "PURGE_BATCH", 3)  # several Redis batches
    for minutes in range(10):
        store.put_dead_letter(dead_letter(f"dl-{minutes}", minutes=minutes))
    assert store.purge_dead_letters(BASE + timedelta(minutes=7)) == 7
    assert [r.id for r in store.list_dead_letters()] == ["dl-9", "dl-8", "dl-7"]
    assert [r.id for r in store.list_dead_letters(category=Category.PERMANENT)] == [
        "dl-9",
        "dl-8",
        "dl-7",
    ]
    assert store.count_dead_letters() == 3
    assert store.purge_dead_letters(BASE) == 0


# -- audit trail -----------------------------------------------------------------------------
def test_audit_events_come_back_oldest_first_for_their_correlation(store: Store) -> None:
    store.add_audit(audit_event("corr-1", "published", 0))
    store.add_audit(audit_event("corr-2", "published", 1))
    store.add_audit(audit_event("corr-1", "succeeded", 3, outcome="charged"))
    store.add_audit(audit_event("corr-1", "started", 2))
    trail = store.audit_for("corr-1")
    assert [event.event for event in trail] == ["published", "started", "succeeded"]
    assert trail[2] == audit_event("corr-1", "succeeded", 3, outcome="charged")
    assert [event.event for event in store.audit_for("corr-2")] == ["published"]
    assert store.audit_for("corr-unknown") == []


def test_a_reservation_records_its_audit_event_only_when_it_reserved(store: Store) -> None:
    assert store.reserve("k-aud", "job-1", 60, audit=audit_event("corr-r", "published", 0)) is None
    held = store.reserve("k-aud", "job-2", 60, audit=audit_event("corr-r", "published", 1))
    assert held == "job-1"
    assert [e.at for e in store.audit_for("corr-r")] == [audit_event("corr-r", "x", 0).at]


def test_a_claim_records_its_audit_event_only_when_taken(store: Store) -> None:
    first = store.claim("k-claim-aud", "a", 30, "d-1", audit=audit_event("corr-c", "started", 0))
    second = store.claim("k-claim-aud", "b", 30, "d-1", audit=audit_event("corr-c", "started", 1))
    assert (first.status, second.status) == (ClaimStatus.CLAIMED, ClaimStatus.HELD)
    assert len(store.audit_for("corr-c")) == 1


def test_complete_records_its_audit_event_in_the_same_step(store: Store) -> None:
    store.claim("k-done-aud", "a", 30, "d-1")
    store.complete("k-done-aud", "a", "ok", 60, None, audit=audit_event("corr-d", "succeeded", 0))
    assert [e.event for e in store.audit_for("corr-d")] == ["succeeded"]
    assert store.claim("k-done-aud", "b", 30, "d-2").status is ClaimStatus.DONE


def test_a_repeated_complete_by_the_same_owner_records_its_audit_event_once(
    store: Store,
) -> None:
    store.claim("k-twice", "a", 30, "d-1")
    for _ in range(2):  # a retried write whose first reply was lost
        store.complete("k-twice", "a", "ok", 60, None, audit=audit_event("corr-t", "succeeded", 0))
    assert [e.event for e in store.audit_for("corr-t")] == ["succeeded"]
    assert store.counters()[("succeeded", "billing.charge.v1")] == 1


def test_purge_audit_drops_old_trails_and_keeps_recent_ones(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_records, "PURGE_BATCH", 2)
    for n in range(5):
        store.add_audit(audit_event(f"old-{n}", "published", n))
        store.add_audit(audit_event(f"old-{n}", "succeeded", n + 1))
    store.add_audit(audit_event("mixed", "published", 0))
    store.add_audit(audit_event("mixed", "retried", 60))
    store.add_audit(audit_event("new", "published", 61))
    assert store.purge_audit(BASE + timedelta(minutes=30)) == 10
    assert all(store.audit_for(f"old-{n}") == [] for n in range(5))
    assert [event.event for event in store.audit_for("mixed")] == ["published", "retried"]
    assert len(store.audit_for("new")) == 1


# -- counters (the metrics exporter's source) ------------------------------------------------
def test_every_recorded_audit_event_moves_its_counter_in_the_same_step(store: Store) -> None:
    store.reserve("k-n", "job-1", 60, audit=audit_event("c-n", "published", 0))
    store.reserve("k-n", "job-2", 60, audit=audit_event("c-n", "published", 1))  # not ours
    store.claim("k-n", "a", LONG, "d-1", audit=audit_event("c-n", "started", 2, wait_s=0.3))
    store.claim("k-n", "b", LONG, "d-1", audit=audit_event("c-n", "started", 3))  # held
    store.complete("k-n", "a", "ok", 60, None, audit=audit_event("c-n", "succeeded", 4, run_s=2))
    store.add_audit(audit_event("c-n", "dead_lettered", 5, category="bug", run_s=700.0))
    store.add_audit(audit_event("c-n", "dead_lettered", 6, category="bug"))
    store.add_audit(audit_event("c-n", "watchdog_alarm", 7))
    task = "billing.charge.v1"
    assert store.counters() == {
        ("published", task): 1,
        ("started", task): 1,
        ("succeeded", task): 1,
        ("dead_lettered:bug", task): 2,
        ("watchdog_alarm", task): 1,
        ("wait_seconds:0.5", task): 1,
        ("wait_seconds:sum_ms", task): 300,
        ("run_seconds:2.5", task): 1,
        ("run_seconds:1800.0", task): 1,
        ("run_seconds:sum_ms", task): 702_000,
    }


def test_counters_add_up_under_fifty_concurrent_writers(store: Store) -> None:
    at_once(50, lambda i: store.add_audit(audit_event(f"c-{i}", "published", 0)))
    assert store.counters() == {("published", "billing.charge.v1"): 50}


def test_a_store_with_no_events_has_no_counters(store: Store) -> None:
    assert store.counters() == {}


# -- choosing a backend ----------------------------------------------------------------------
def test_open_store_picks_the_backend_by_scheme(tmp_path: Path) -> None:
    sql = open_store(f"sqlite:///{tmp_path / 'open.db'}")
    try:
        assert isinstance(sql, SQLStore)
    finally:
        sql.close()
    kv = open_store(REDIS_URL)
    try:
        assert isinstance(kv, RedisStore)
    finally:
        kv.close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://h:6379/0", ("redis", "redis://h:6379/0")),
        ("rediss://h:6380/0", ("redis", "rediss://h:6380/0")),
        ("unix:///run/redis.sock?db=1", ("redis", "unix:///run/redis.sock?db=1")),
        ("sqlite:////var/db/cc.db", ("sql", "sqlite:////var/db/cc.db")),
        ("postgresql://u@h/db", ("sql", "postgresql+psycopg://u@h/db")),
        ("postgres://u@h/db", ("sql", "postgresql+psycopg://u@h/db")),
        ("postgresql+psycopg://u@h/db", ("sql", "postgresql+psycopg://u@h/db")),
    ],
)
def test_store_urls_resolve_to_their_backend_and_postgres_uses_psycopg(
    url: str, expected: tuple[str, str]
) -> None:
    assert resolve_url(url) == expected


def test_open_store_names_the_accepted_schemes_for_anything_else() -> None:
    with pytest.raises(ValueError, match=r"redis://.*postgresql\+psycopg://"):
        open_store("mysql://root@localhost/app")
    with pytest.raises(ValueError, match="unsupported store URL"):
        open_store("127.0.0.1:6379")


# -- payload fingerprints (one key, one payload) ------------------------------------------


def test_a_held_reservation_answers_its_holder_with_the_fingerprint_it_was_taken_with(
    store: Store,
) -> None:
    assert store.reserve("order:1", "job-a", LONG, fingerprint="v1:aaaa") is None
    holder = store.reserve("order:1", "job-b", LONG, fingerprint="v1:bbbb")
    assert holder == "job-a"
    assert getattr(holder, "fingerprint", None) == "v1:aaaa"


def test_a_reservation_taken_again_after_its_release_forgets_the_old_fingerprint(
    store: Store,
) -> None:
    store.reserve("order:1", "job-a", None, fingerprint="v1:aaaa")
    store.unreserve("order:1", "job-a")
    assert store.reserve("order:1", "job-b", None) is None  # a publisher without one
    holder = store.reserve("order:1", "job-c", None, fingerprint="v1:cccc")
    assert holder == "job-b" and getattr(holder, "fingerprint", "x") is None


def test_a_claim_of_a_done_key_answers_the_fingerprint_recorded_with_done(store: Store) -> None:
    store.reserve("charge:1", "job-a", LONG, fingerprint="v1:aaaa")
    store.claim("charge:1", "exec-a", LONG, "job-a:0")
    store.complete("charge:1", "exec-a", "succeeded", LONG, "job-a", fingerprint="v1:aaaa")
    claim = store.claim("charge:1", "exec-b", LONG, "job-b:0")
    assert (claim.status, claim.fingerprint) == (ClaimStatus.DONE, "v1:aaaa")
    assert store.reserve("charge:1", "job-b", LONG, fingerprint="v1:bbbb") is None  # released


def test_a_key_done_without_a_fingerprint_answers_none(store: Store) -> None:
    store.claim("charge:1", "exec-a", LONG, "job-a:0")
    store.complete("charge:1", "exec-a", "succeeded", LONG, None)
    assert store.claim("charge:1", "exec-b", LONG, "job-b:0").fingerprint is None


def test_an_sql_store_of_an_earlier_release_gains_the_fingerprint_columns(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    with engine.begin() as conn:  # the two tables as the release before kept them
        conn.exec_driver_sql(
            "CREATE TABLE cc_dedup (key VARCHAR PRIMARY KEY, job_id VARCHAR NOT NULL, "
            "expires_at DATETIME)"
        )
        conn.exec_driver_sql(
            "CREATE TABLE cc_ledger (key VARCHAR PRIMARY KEY, state VARCHAR(16) NOT NULL, "
            "owner VARCHAR NOT NULL, lease_until DATETIME NOT NULL, outcome TEXT, "
            "updated_at DATETIME NOT NULL)"
        )
        conn.exec_driver_sql("INSERT INTO cc_dedup VALUES ('old:1', 'job-old', NULL)")
    store = SQLStore(engine)
    try:
        holder = store.reserve("old:1", "job-new", LONG, fingerprint="v1:aaaa")
        assert holder == "job-old" and getattr(holder, "fingerprint", "x") is None
        store.claim("new:1", "exec", LONG, "d:0")
        store.complete("new:1", "exec", "succeeded", LONG, None, fingerprint="v1:aaaa")
        assert store.claim("new:1", "exec-2", LONG, "d2:0").fingerprint == "v1:aaaa"
    finally:
        store.close()
        engine.dispose()
