"""Retention on the SQL store, against real PostgreSQL and SQLite.

The Redis store lets its ledger entries, delivery counters, reservations, leases and state
documents expire by TTL; the SQL store keeps an expiry column instead, and retention deletes
the rows past it, in bounded batches. Every expiry is judged by the database's clock, never
by the clock of the process that writes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
import sqlalchemy as sa

from conventions.app import App
from conventions.ops import retention
from conventions.store import SQLStore, sql, sql_coordination, sql_tables
from conventions.store.records import ClaimStatus, utcnow
from tests.integration.test_store_contract import (  # noqa: F401  (fixtures)
    LEASE,
    LONG,
    PAST_LEASE,
    _wipe_sql,
    postgresql_backend,
    sqlite_backend,
)


@pytest.fixture(params=["postgresql", "sqlite"])
def sql_store(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    """An empty SQL store on each dialect, wiped again after the test."""
    backend = cast(SQLStore, request.getfixturevalue(f"{request.param}_backend"))
    try:
        yield backend
    finally:
        _wipe_sql(backend)


def _count(store: SQLStore, table: sa.Table) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _keys(store: SQLStore, table: sa.Table) -> set[str]:
    (key,) = table.primary_key.columns
    with store.engine.connect() as conn:
        return {str(value) for value in conn.execute(sa.select(key)).scalars()}


def _write_rows(store: SQLStore, prefix: str, ttl: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row in each expiring table (a done key too), all living ``ttl`` seconds."""
    monkeypatch.setattr(store, "delivery_ttl", ttl)
    store.reserve(f"{prefix}-reserved", "job-1", ttl)
    store.claim(f"{prefix}-running", "exec-1", ttl, f"{prefix}-delivery-1")
    store.claim(f"{prefix}-done", "exec-1", LONG, f"{prefix}-delivery-2")
    store.complete(f"{prefix}-done", "exec-1", "ok", ttl, None)
    assert store.acquire(f"{prefix}-lease", "owner-1", ttl) is None
    store.put_state(f"{prefix}-state", {"step": 1}, ttl)


def test_retention_deletes_expired_ledger_delivery_reservation_lease_and_state_rows(
    sql_store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_rows(sql_store, "old", LEASE, monkeypatch)
    time.sleep(PAST_LEASE)  # real expiry: the rows' own deadlines pass
    _write_rows(sql_store, "new", LONG, monkeypatch)
    sql_store.put_state("forever", {"step": 2}, None)
    sql_store.reserve("kept-reserved", "job-2", None)

    deleted = retention.purge_expired(sql_store)

    s = sql_store
    assert _keys(s, s.ledger) == {"new-running", "new-done"}
    assert _keys(s, s.deliveries) == {"new-delivery-1", "new-delivery-2"}
    assert _keys(s, s.dedup) == {"new-reserved", "kept-reserved"}
    assert _keys(s, s.leases) == {"new-lease"}
    assert _keys(s, s.states) == {"new-state", "forever"}
    assert deleted == {"ledger": 2, "deliveries": 2, "dedup": 1, "leases": 1, "states": 1}
    assert retention.purge_expired(sql_store) == dict.fromkeys(deleted, 0)


def test_the_worker_purger_deletes_expired_sql_rows_with_the_dead_letters(
    sql_store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_rows(sql_store, "old", LEASE, monkeypatch)
    time.sleep(PAST_LEASE)
    app = cast(App, type("FakeApp", (), {"store": sql_store})())
    purger = retention.Purger(
        app, dead_letters=timedelta(days=30), audit=timedelta(days=14), interval=timedelta(hours=6)
    )
    assert purger.run_once() == (0, 0)
    assert _count(sql_store, sql_store.ledger) == 0
    assert _count(sql_store, sql_store.leases) == 0


def test_expired_rows_are_deleted_in_bounded_batches(
    sql_store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_tables, "EXPIRED_BATCH", 2)
    for i in range(5):
        sql_store.acquire(f"lease-{i}", "owner", LEASE)
    time.sleep(PAST_LEASE)
    deletes: list[int] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            deletes.append(cursor.rowcount)

    sa.event.listen(sql_store.engine, "after_cursor_execute", seen)
    try:
        assert retention.purge_expired(sql_store)["leases"] == 5
    finally:
        sa.event.remove(sql_store.engine, "after_cursor_execute", seen)
    assert _count(sql_store, sql_store.leases) == 0
    assert deletes and max(deletes) <= 2


def _slow_clock(monkeypatch: pytest.MonkeyPatch, behind: timedelta) -> None:
    """The writing process's clock runs ``behind`` the database's."""

    def slow() -> datetime:
        return utcnow() - behind

    for module in (sql, sql_coordination):
        monkeypatch.setattr(module, "utcnow", slow, raising=False)


def test_a_lease_written_by_a_slow_clock_is_still_held_by_the_databases_clock(
    sql_store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_clock(monkeypatch, timedelta(hours=1))
    assert sql_store.acquire("lock:report", "worker-a", LONG) is None
    claimed = sql_store.claim("charge:1", "exec-a", LONG, "delivery-1")
    sql_store.reserve("charge:2", "job-a", LONG)
    monkeypatch.undo()  # another worker, whose clock is right

    assert sql_store.acquire("lock:report", "worker-b", LONG) == "worker-a"
    assert sql_store.lease_holder("lock:report") == "worker-a"
    assert claimed.status is ClaimStatus.CLAIMED
    held = sql_store.claim("charge:1", "exec-b", LONG, "delivery-1")
    assert (held.status, held.holder) == (ClaimStatus.HELD, "exec-a")
    assert sql_store.reserve("charge:2", "job-b", LONG) == "job-a"


def test_a_lease_renewed_by_a_fast_clock_still_expires_by_the_databases_clock(
    sql_store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sql_store.acquire("lock:report", "worker-a", LEASE) is None
    _slow_clock(monkeypatch, -timedelta(hours=1))  # a clock an hour ahead
    assert sql_store.renew_lease("lock:report", "worker-a", LEASE)
    monkeypatch.undo()
    time.sleep(PAST_LEASE)
    assert sql_store.acquire("lock:report", "worker-b", LONG) is None
