"""The outbox against real PostgreSQL and Redis: add in the caller's transaction, relay
publishes, a thread worker runs the job.

Order ids used here (no other test touches them): ``ord_ob_*``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa

from conventions import ConfigurationError, PayloadError, bind
from conventions.tracing.headers import (
    CAUSATION,
    CORRELATION,
    ENQUEUED_AT,
    IDEMPOTENCY_KEY,
    REQUEST,
)
from conventions.transactional import outbox
from conventions.transactional.relay import Relay
from tasks import app, db
from tasks.receipts import send_receipt
from tests.integration import support_outbox as ob
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


@pytest.fixture
def engine() -> sa.Engine:
    return ob.reset_outbox()


def _names_by_task(correlation_id: str) -> dict[str, Counter[str]]:
    names: dict[str, Counter[str]] = {}
    for event in app.store.audit_for(correlation_id):
        names.setdefault(event.task_id, Counter())[event.event] += 1
    return names


def test_a_committed_row_is_published_by_the_relay_and_its_job_runs(engine: sa.Engine) -> None:
    with bind(correlation_id="corr-ob-commit"), db.transaction() as session:
        ob.new_order(session, "ord_ob_commit")
        task_id = outbox.add(session, send_receipt, order_id="ord_ob_commit")
    (row,) = ob.rows(engine)
    assert row.task_id == task_id and row.published_at is None

    result = Relay(app, engine).drain()

    assert (result.published, result.failed, result.unavailable) == (1, 0, None)
    wait_for(lambda: ob.receipts_sent("ord_ob_commit")["ord_ob_commit"] == 1)
    (row,) = ob.rows(engine)
    assert row.published_at is not None
    events = wait_for(lambda: _names_by_task("corr-ob-commit").get(task_id, {}).get("succeeded"))
    assert events == 1
    assert outbox.lag(engine) == 0.0


def test_a_rolled_back_row_is_never_published(engine: sa.Engine) -> None:
    with pytest.raises(RuntimeError, match="payment declined"), db.transaction() as session:
        ob.new_order(session, "ord_ob_rollback")
        outbox.add(session, send_receipt, order_id="ord_ob_rollback")
        session.flush()  # the row reached the database, inside the transaction
        raise RuntimeError("payment declined")

    assert ob.rows(engine) == []
    assert Relay(app, engine).drain().claimed == 0
    assert ob.receipts_sent("ord_ob_rollback") == {"ord_ob_rollback": 0}


def test_add_refuses_a_bad_call_exactly_like_delay_and_writes_nothing(engine: sa.Engine) -> None:
    for bad in ({"order_id": "bad id"}, {"order_id": "ord_1", "email": "a@b.c"}, {}):
        with pytest.raises(PayloadError) as by_delay:
            send_receipt.delay(**bad)
        with pytest.raises(PayloadError) as by_outbox, db.transaction() as session:
            outbox.add(session, send_receipt, **bad)
        assert str(by_outbox.value) == str(by_delay.value)
    assert ob.rows(engine) == []


def test_the_row_holds_what_delay_would_publish_with_the_bound_context(
    engine: sa.Engine,
) -> None:
    with bind(correlation_id="corr-ob-ctx", request_id="req-7"), db.transaction() as session:
        outbox.add(session, send_receipt, order_id="ord_ob_ctx", layout="detailed")
        with pytest.raises(ConfigurationError, match="key_override=True"):
            outbox.add_call(
                session, send_receipt, {"order_id": "ord_ob_ctx2"}, idempotency_key="custom-key"
            )  # the task derives its key: a row never carries another one
    [first] = ob.rows(engine)
    assert first.task == "email.send_receipt.v2"
    assert first.kwargs == {"order_id": "ord_ob_ctx", "layout": "detailed"}
    assert first.idempotency_key == "email.send_receipt:receipt:ord_ob_ctx"
    assert first.headers[IDEMPOTENCY_KEY] == "receipt:ord_ob_ctx"
    assert first.headers[CORRELATION] == "corr-ob-ctx"
    assert first.headers[REQUEST] == "req-7"
    assert first.headers[CAUSATION] == "request:req-7"
    assert ENQUEUED_AT in first.headers


def test_a_relay_that_died_before_marking_republishes_the_same_task_id_and_the_job_runs_once(
    engine: sa.Engine,
) -> None:
    with bind(correlation_id="corr-ob-crash"), db.transaction() as session:
        ob.new_order(session, "ord_ob_crash")
        task_id = outbox.add(session, send_receipt, order_id="ord_ob_crash")
    relay = Relay(app, engine)
    (row,) = ob.rows(engine)
    relay.publish(row)  # published, then the relay "dies": the row is not marked
    wait_for(lambda: _names_by_task("corr-ob-crash").get(task_id, {}).get("succeeded"))

    result = relay.drain()  # the next relay publishes the row again

    assert result.published == 1
    names = wait_for(
        lambda: (found := _names_by_task("corr-ob-crash")[task_id])["skipped_duplicate"] and found
    )
    assert list(_names_by_task("corr-ob-crash")) == [task_id]  # one task id, ever
    assert names["succeeded"] == 1 and names["skipped_duplicate"] == 1
    assert ob.receipts_sent("ord_ob_crash") == {"ord_ob_crash": 1}
    assert ob.rows(engine)[0].published_at is not None


def test_a_row_that_cannot_be_published_backs_off_without_blocking_the_others(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with db.transaction() as session:
        ob.new_order(session, "ord_ob_after_bad")
        with bind(correlation_id="corr-ob-bad"):
            bad = outbox.row_for(send_receipt, {"order_id": "ord_ob_bad"})
        session.execute(sa.insert(outbox.table).values({**bad, "task": "email.gone.v1"}))
        outbox.add(session, send_receipt, order_id="ord_ob_after_bad")

    with caplog.at_level(logging.WARNING, logger="conventions.transactional.relay"):
        result = Relay(app, engine).drain()

    # the relay's line about the row carries the row's own story
    (line,) = [r for r in caplog.records if "not published" in r.getMessage()]
    assert (line.correlation_id, line.task, line.task_id) == (
        "corr-ob-bad", "email.gone.v1", bad["task_id"],
    )  # fmt: skip

    assert (result.published, result.failed, result.unavailable) == (1, 1, None)
    (stuck,) = ob.rows(engine, task="email.gone.v1")
    assert stuck.published_at is None and stuck.attempts == 1
    assert stuck.next_attempt_at > stuck.created_at
    assert "email.gone.v1" in stuck.last_error
    state = outbox.status(engine)
    assert (state.pending, state.failing, state.published) == (1, 1, 1)
    assert state.last_error == stuck.last_error
    assert Relay(app, engine).drain().claimed == 0  # not due again yet
    wait_for(lambda: ob.receipts_sent("ord_ob_after_bad")["ord_ob_after_bad"] == 1)


def test_lag_is_the_age_of_the_oldest_unpublished_row(engine: sa.Engine) -> None:
    assert outbox.lag(engine) == 0.0
    with db.transaction() as session:
        outbox.add(session, send_receipt, order_id="ord_ob_lag")
    (row,) = ob.rows(engine)
    assert outbox.lag(engine, now=row.created_at + timedelta(seconds=90)) == pytest.approx(90)
    assert 0.0 <= outbox.lag(engine) < 60


def test_purge_deletes_published_rows_past_retention_and_keeps_pending_ones(
    engine: sa.Engine,
) -> None:
    with db.transaction() as session:
        ob.new_order(session, "ord_ob_purge")
        outbox.add(session, send_receipt, order_id="ord_ob_purge")
    Relay(app, engine).drain()
    with db.transaction() as session:
        outbox.add(session, send_receipt, order_id="ord_ob_purge_pending")
    (published,) = ob.rows(engine, task_id=ob.rows(engine)[0].task_id)
    later = published.published_at + timedelta(days=8)

    assert outbox.purge(engine, timedelta(days=7), now=published.published_at) == 0
    assert outbox.purge(engine, timedelta(days=7), now=later) == 1
    assert [row.kwargs["order_id"] for row in ob.rows(engine)] == ["ord_ob_purge_pending"]


def test_outbox_status_and_relay_once_run_as_commands(engine: sa.Engine) -> None:
    with db.transaction() as session:
        ob.new_order(session, "ord_ob_cli")
        outbox.add(session, send_receipt, order_id="ord_ob_cli")

    status = ob.cli("outbox", "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pending"] == 1
    unhealthy = ob.cli("outbox", "status", "--max-lag", "0.001")
    assert unhealthy.returncode == 1 and "outbox lag" in unhealthy.stderr
    relay = ob.cli("outbox", "relay", "--once", "--batch", "10")
    assert relay.returncode == 0, relay.stderr
    assert "published 1 (0 deduplicated), failed 0" in relay.stdout
    wait_for(lambda: ob.receipts_sent("ord_ob_cli")["ord_ob_cli"] == 1)
    status = ob.cli("outbox", "status")
    assert "pending 0 (failing 0), published kept 1, lag 0.0s" in status.stdout
    assert ob.cli("outbox", "status", "--max-lag", "0.001").returncode == 0


def test_the_metrics_exporter_reads_the_lag_of_the_configured_outbox(engine: sa.Engine) -> None:
    from conventions.ops import exporter as metrics

    read = metrics.default_outbox_lag(app)  # conventions_outbox_url: the shop's database
    assert read is not None
    assert read() == 0.0
    with db.transaction() as session:
        ob.new_order(session, "ord_ob_metric")
        outbox.add(session, send_receipt, order_id="ord_ob_metric")
    wait_for(lambda: (read() or 0) >= 1.0, timeout=10)
