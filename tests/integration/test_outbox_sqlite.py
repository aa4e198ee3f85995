"""The outbox on SQLite (the embedded default): one relay at a time, by lease.

No worker consumes here: the published messages are read from the broker's queue.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from conventions.store.records import utcnow
from conventions.store.sql import make_engine
from conventions.transactional import outbox
from conventions.transactional.relay import Relay, lock_table
from tasks import app, shop
from tasks.receipts import send_receipt

pytestmark = pytest.mark.usefixtures("clean_store")

QUEUE = "email"


@pytest.fixture
def sqlite_url(tmp_path: Path, broker_redis: redis.Redis) -> Iterator[str]:
    """An app database on SQLite with the outbox table, and an empty ``email`` queue."""
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    web = shop.make_engine(url)  # the web app's engine: WAL, busy timeout
    outbox.create_table(web)
    web.dispose()
    broker_redis.delete(QUEUE)
    yield url
    broker_redis.delete(QUEUE)


def _queued_task_ids(broker: redis.Redis) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in broker.lrange(QUEUE, 0, -1)]


def test_on_sqlite_rows_committed_through_a_session_are_published_with_their_task_ids(
    sqlite_url: str, broker_redis: redis.Redis
) -> None:
    web = shop.make_engine(sqlite_url)
    with Session(web) as session, session.begin():
        first = outbox.add(session, send_receipt, order_id="ord_sq_1")
        second = outbox.add(session, send_receipt, order_id="ord_sq_2")
    with Session(web) as session:
        outbox.add(session, send_receipt, order_id="ord_sq_3")
        session.rollback()
    web.dispose()
    engine = make_engine(sqlite_url)

    result = Relay(app, engine).drain()

    assert (result.claimed, result.published, result.unavailable) == (2, 2, None)
    assert sorted(_queued_task_ids(broker_redis)) == sorted([first, second])
    assert outbox.status(engine).pending == 0
    engine.dispose()


def test_on_sqlite_a_second_relay_waits_until_the_first_gives_up_its_lease(
    sqlite_url: str, broker_redis: redis.Redis
) -> None:
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        outbox.add(conn, send_receipt, order_id="ord_sq_lease")
    first, second = Relay(app, engine, owner="first"), Relay(app, engine, owner="second")
    assert first.run_batch().published == 1

    with engine.begin() as conn:
        outbox.add(conn, send_receipt, order_id="ord_sq_lease_2")
    blocked = second.run_batch()
    assert blocked.locked_out and blocked.claimed == 0
    assert outbox.status(engine).pending == 1

    first.release()
    assert second.run_batch().published == 1
    assert len(_queued_task_ids(broker_redis)) == 2
    engine.dispose()


def test_on_sqlite_the_lease_of_a_dead_relay_is_taken_over_when_it_expires(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    dead, alive = Relay(app, engine, owner="dead"), Relay(app, engine, owner="alive")
    assert not dead.run_batch().locked_out
    assert alive.run_batch().locked_out
    with engine.begin() as conn:  # the dead relay stopped renewing: its lease ran out
        conn.execute(sa.update(lock_table).values(lease_until=utcnow()))
    assert not alive.run_batch().locked_out
    assert dead.run_batch().locked_out
    engine.dispose()
