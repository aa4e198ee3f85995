"""An outbox row written by a newer release (its ``_cc_row`` above ``formats.OUTBOX_ROW``)
is left by an older relay for a newer one: not published, no attempt spent, never
dead-lettered; a relay of the new release publishes it. SQLite app database, real Redis
broker; no worker consumes (the published message is read from the queue)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from conventions.config import formats
from conventions.store.records import utcnow
from conventions.store.sql import make_engine
from conventions.tracing import headers as hdr
from conventions.transactional import outbox
from conventions.transactional.relay import NEWER_ROW_DELAY, Relay
from tasks import app, shop
from tasks.receipts import send_receipt

pytestmark = pytest.mark.usefixtures("clean_store")

QUEUE = "email"


@pytest.fixture
def sqlite_url(tmp_path: Path, broker_redis: redis.Redis) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    web = shop.make_engine(url)
    outbox.create_table(web)
    web.dispose()
    broker_redis.delete(QUEUE)
    yield url
    broker_redis.delete(QUEUE)


def test_an_older_relay_leaves_a_newer_row_to_a_newer_relay(
    sqlite_url: str, broker_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer = formats.OUTBOX_ROW + 1
    web = shop.make_engine(sqlite_url)
    with monkeypatch.context() as release, Session(web) as session, session.begin():
        release.setattr(formats, "OUTBOX_ROW", newer)
        task_id = outbox.add(session, send_receipt, order_id="ord_fmt_1")
    web.dispose()
    engine = make_engine(sqlite_url)
    t = outbox.table

    before = utcnow()
    relay = Relay(app, engine)
    result = relay.drain()
    assert (result.claimed, result.published, result.newer, result.failed) == (1, 0, 1, 0)
    assert broker_redis.llen(QUEUE) == 0
    with engine.connect() as conn:
        row = conn.execute(sa.select(t).where(t.c.task_id == task_id)).one()
    assert row.attempts == 0 and row.failed_at is None and row.published_at is None
    assert "outbox row written by a newer release" in row.last_error
    assert row.next_attempt_at >= before + timedelta(seconds=NEWER_ROW_DELAY - 1)

    # a relay of the new release, once the row is due again
    with engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.task_id == task_id).values(next_attempt_at=utcnow()))
    monkeypatch.setattr(formats, "OUTBOX_ROW", newer)  # the relay runs the new release now
    result = relay.drain()
    assert (result.published, result.newer) == (1, 0)
    [raw] = broker_redis.lrange(QUEUE, 0, -1)
    headers = json.loads(raw)["headers"]
    assert headers["id"] == task_id
    assert formats.ROW_FIELD not in headers  # the row's own field is not a header
    assert headers[hdr.FORMAT] == formats.HEADERS
    engine.dispose()


def test_a_row_of_this_release_carries_no_version_field(sqlite_url: str) -> None:
    web = shop.make_engine(sqlite_url)
    with Session(web) as session, session.begin():
        task_id = outbox.add(session, send_receipt, order_id="ord_fmt_2")
    with web.connect() as conn:
        row = conn.execute(sa.select(outbox.table).where(outbox.table.c.task_id == task_id)).one()
    assert formats.ROW_FIELD not in row.headers
    web.dispose()
