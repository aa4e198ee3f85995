"""Two first events of one run, written at once by two real PostgreSQL connections.

Nothing to lock exists before a run's first event: two transactions that both find no
row must still end with one row holding both events' fields (``published``'s actor,
``started``'s attempt and worker), whichever commits first. Threads meet at a barrier
right before their writes, many times over.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from conventions.observability import audit
from conventions.store import SQLStore
from conventions.store.records import AuditEvent
from conventions.store.sql import make_engine
from conventions.tracing import headers as hdr
from tests.fixtures import unavailable

TASK = "billing.charge.v2"
#: pairs of first events raced (each a fresh run)
ROUNDS = 40


@pytest.fixture(scope="module")
def postgresql_store(shop_database: str) -> Iterator[SQLStore]:
    engine = make_engine(shop_database)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        engine.dispose()
        unavailable("PostgreSQL", exc)
    store = SQLStore(engine, table_prefix=f"cc_race_{uuid.uuid4().hex[:10]}_")
    try:
        yield store
    finally:
        store.metadata.drop_all(engine)
        engine.dispose()


def _race(store: SQLStore, task_id: str) -> None:
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    found = {hdr.CORRELATION: "c-race", hdr.IDEMPOTENCY_KEY: "charge:race"}
    published = audit.event("published", TASK, task_id, {**found, hdr.ACTOR: "ops:ann"}, at=at)
    started = audit.event("started", TASK, task_id, found, attempt=1,
                          at=at + timedelta(seconds=1))  # fmt: skip
    assert started.run is not None
    started = started.with_run({**started.run, "attempt": {**started.run["attempt"],
                                                           "worker": "w1@host"}})  # fmt: skip
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def write(event: AuditEvent) -> None:
        try:
            barrier.wait(timeout=10)
            store.add_audit(event)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(e,)) for e in (published, started)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors


def test_two_first_events_of_a_run_written_at_once_both_land(
    postgresql_store: SQLStore,
) -> None:
    lost = []
    for n in range(ROUNDS):
        task_id = f"race-{n}"
        _race(postgresql_store, task_id)
        run = postgresql_store.get_run(task_id)
        assert run is not None
        kept = (run.state, run.actor, [(a.n, a.worker) for a in run.attempts])
        if kept != ("running", "ops:ann", [(1, "w1@host")]):
            lost.append((task_id, kept))
    assert lost == [], f"{len(lost)} of {ROUNDS} runs lost an event's fields: {lost[:3]}"
