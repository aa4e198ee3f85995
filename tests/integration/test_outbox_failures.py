"""The relay's failure paths against real PostgreSQL and Redis, with a thread worker.

* a row deduplicated against a reservation whose job will never run it is published for
  real (a holder that succeeded is trusted: the effect happened);
* a row that fails for its own reason is dead-lettered after its attempts, visible to
  ``conventions outbox``, and no longer retried.

Order ids used here (no other test touches them): ``ord_of_*``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from conventions.store.records import Category
from conventions.store.sql import make_engine
from conventions.transactional import outbox
from conventions.transactional.relay import Relay
from tasks import app, db
from tasks.receipts import send_receipt
from tests.integration import support_outbox as ob
from tests.integration.helpers import SpareRedis, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

#: the reservation ``until_done`` keeps when its job never releases it (the ledger keep)
RESERVATION_TTL = 7 * 86400.0


@pytest.fixture
def engine() -> sa.Engine:
    return ob.reset_outbox()


def _events(task_id: str) -> Counter[str]:
    (row,) = ob.rows(db.engine(), task_id=task_id)
    trail = app.store.audit_for(row.headers["cc_correlation"])
    return Counter(event.event for event in trail if event.task_id == task_id)


def _add(order_id: str) -> str:
    with db.transaction() as session:
        ob.new_order(session, order_id)
        return outbox.add(session, send_receipt, order_id=order_id)


def _never_queued(holder: str) -> None:
    """The holder's job is lost: published never, or deleted from the broker."""


def _dead_lettered(holder: str) -> None:
    app.backend.mark_as_failure(holder, RuntimeError("dead-lettered as bug"))


def _revoked(holder: str) -> None:
    app.backend.mark_as_revoked(holder, reason="revoked")


@pytest.mark.parametrize("fate", [_never_queued, _dead_lettered, _revoked])
def test_a_row_deduplicated_against_a_holder_that_will_never_run_it_is_published_for_real(
    engine: sa.Engine, fate: Callable[[str], None]
) -> None:
    order_id = f"ord_of_{fate.__name__.strip('_')}"
    holder = f"gone-{order_id}"
    assert (
        app.store.reserve(f"email.send_receipt:receipt:{order_id}", holder, RESERVATION_TTL) is None
    )
    fate(holder)
    task_id = _add(order_id)

    result = Relay(app, engine).drain()

    assert (result.published, result.deduplicated, result.failed) == (1, 0, 0)
    wait_for(lambda: ob.receipts_sent(order_id)[order_id] == 1, timeout=20)
    assert wait_for(lambda: _events(task_id)["succeeded"]) == 1
    assert ob.rows(engine, task_id=task_id)[0].published_at is not None


def test_a_row_deduplicated_against_a_holder_that_succeeded_is_published_without_a_new_job(
    engine: sa.Engine,
) -> None:
    order_id = "ord_of_done"
    with db.transaction() as session:
        ob.new_order(session, order_id)
    first = send_receipt.delay(order_id=order_id)
    wait_for(lambda: ob.receipts_sent(order_id)[order_id] == 1)
    wait_for(lambda: first.state == "SUCCESS")
    # its reservation outlived it (a release that never reached the store)
    assert (
        app.store.reserve(f"email.send_receipt:receipt:{order_id}", first.id, RESERVATION_TTL)
        is None
    )
    with db.transaction() as session:
        task_id = outbox.add(session, send_receipt, order_id=order_id)

    result = Relay(app, engine).drain()

    assert (result.published, result.deduplicated) == (1, 1)
    assert ob.rows(engine, task_id=task_id)[0].published_at is not None
    assert _events(task_id)["published"] == 0  # the effect happened: nothing more to send
    assert ob.receipts_sent(order_id) == {order_id: 1}


def _make_due(engine: sa.Engine) -> None:
    t = outbox.table
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(next_attempt_at=t.c.created_at))


def test_a_row_that_fails_for_its_own_reason_is_dead_lettered_after_its_attempts(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.conf, "conventions_outbox_max_attempts", 3)
    with db.transaction() as session:
        ob.new_order(session, "ord_of_after_bad")
        unknown = outbox.row_for(send_receipt, {"order_id": "ord_of_unknown"})
        session.execute(sa.insert(outbox.table).values({**unknown, "task": "email.gone.v1"}))
        invalid = outbox.row_for(send_receipt, {"order_id": "ord_of_invalid"})
        session.execute(sa.insert(outbox.table).values({**invalid, "kwargs": {"order_id": "x y"}}))
        good = outbox.add(session, send_receipt, order_id="ord_of_after_bad")

    for attempt in (1, 2, 3):
        result = Relay(app, engine).drain()
        assert result.failed == 2, attempt
        _make_due(engine)
    assert (result.dead, Relay(app, engine).drain().claimed) == (2, 0)  # never tried again

    for row, category in ((unknown, Category.INVALID), (invalid, Category.INVALID)):
        (stored,) = ob.rows(engine, task_id=row["task_id"])
        assert stored.failed_at is not None and stored.published_at is None
        assert stored.attempts == 3
        letter = wait_for(lambda r=row: _dead_letter(r["task_id"]))
        assert letter.category == category
        assert (letter.task, letter.payload) == (stored.task, stored.kwargs)
        assert letter.idempotency_key == stored.idempotency_key
        assert letter.attempts == 3 and letter.message == stored.last_error
    assert ob.rows(engine, task_id=good)[0].published_at is not None
    state = outbox.status(engine)
    assert (state.pending, state.dead, state.lag) == (0, 2, 0.0)

    shown = ob.cli("outbox", "status", "--json")
    assert json.loads(shown.stdout)["dead"] == 2, shown.stderr
    listed = ob.cli("outbox", "dead", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {row["task_id"] for row in json.loads(listed.stdout)} == {
        unknown["task_id"], invalid["task_id"],
    }  # fmt: skip


def _dead_letter(task_id: str) -> object:
    found = [d for d in app.store.list_dead_letters(limit=50) if d.task_id == task_id]
    return found[0] if found else None


def test_a_row_is_marked_dead_only_once_its_dead_letter_is_written(
    engine: sa.Engine, spare_store: SpareRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.conf, "conventions_outbox_max_attempts", 1)
    with db.transaction() as session:
        row = outbox.row_for(send_receipt, {"order_id": "ord_of_store_down"})
        session.execute(sa.insert(outbox.table).values({**row, "task": "email.gone.v1"}))
    spare_store.stop()

    down = Relay(app, engine).drain()

    assert (down.failed, down.dead) == (1, 0)
    (kept,) = ob.rows(engine, task_id=row["task_id"])
    assert kept.failed_at is None and kept.attempts == 1  # tried again later
    spare_store.start()
    _make_due(engine)

    back = Relay(app, engine).drain()

    assert back.dead == 1
    assert ob.rows(engine, task_id=row["task_id"])[0].failed_at is not None
    (letter,) = app.store.list_dead_letters(task="email.gone.v1")
    assert letter.task_id == row["task_id"] and letter.category == Category.INVALID


def test_an_outbox_table_made_before_dead_lettering_gets_its_column(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'old.sqlite3'}")
    old = sa.MetaData()
    columns = [c for c in outbox.table.c if c.name != "failed_at"]
    sa.Table(
        "cc_outbox",
        old,
        *(
            sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in columns
        ),
    )
    old.create_all(engine)

    outbox.create_table(engine)
    outbox.create_table(engine)  # idempotent

    columns = {c["name"] for c in sa.inspect(engine).get_columns("cc_outbox")}
    assert "failed_at" in columns
    assert outbox.status(engine).dead == 0
    engine.dispose()
