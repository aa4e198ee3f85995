"""The key a job runs under is its declaration's (issue 20 items 3, 4 and 12).

A per-call ``idempotency_key=`` or a foreign ``cc_idempotency_key`` header never replaces
the key a task derives from its payload; keys are namespaced by task, so two tasks whose
templates render the same string keep their own ledger entries. Real Redis, a real
(thread) worker, the shop's PostgreSQL database.
"""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection, Producer

from conventions import ConfigurationError, Id, JobContext, Payload
from conventions.errors import KeyConflict
from conventions.store.records import Category
from conventions.tracing.headers import IDEMPOTENCY_KEY
from tasks import app, db, shop
from tasks.payments import apply_event
from tests.integration.helpers import dead_letter_of, publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

#: a seeded payment event no other integration test touches
EVENT = "evt_0017"


class Twin(Payload):
    call_id: Id


@app.job("testing.twin_a.v1", payload=Twin, key="twin:{call_id}", workload="email")
def twin_a(payload: Twin, ctx: JobContext) -> dict[str, Any]:
    return {"ran": "a", "key": ctx.idempotency_key}


@app.job("testing.twin_b.v1", payload=Twin, key="twin:{call_id}", workload="email")
def twin_b(payload: Twin, ctx: JobContext) -> dict[str, Any]:
    return {"ran": "b", "key": ctx.idempotency_key}


@app.job(
    "testing.given_key.v1", payload=Twin, key="given:{call_id}", workload="email",
    key_override=True,
)  # fmt: skip
def given_key(payload: Twin, ctx: JobContext) -> str:
    return ctx.idempotency_key


class Charge(Payload):
    call_id: Id
    amount: int


@app.job("testing.key_charge.v1", payload=Charge, key="kcharge:{call_id}", workload="email")
def key_charge(payload: Charge, ctx: JobContext) -> int:
    return payload.amount


def _paid(order_id: str) -> int:
    with db.transaction() as session:
        order = session.get(shop.Order, order_id)
        assert order is not None
        return int(order.paid_minor)


def _event(event_id: str) -> tuple[str, int]:
    with db.transaction() as session:
        event = session.get(shop.PaymentEvent, event_id)
        assert event is not None
        return str(event.order_id), int(event.amount_minor)


def _foreign(task: str, kwargs: dict[str, Any], headers: dict[str, Any]) -> str:
    with Connection(app.conf.broker_url) as conn:
        return publish_foreign(Producer(conn), task, kwargs, "email", headers=headers)


def _finished(task_id: str) -> bool:
    return bool(app.AsyncResult(task_id).state in ("SUCCESS", "FAILURE"))


def test_the_payment_case_one_event_published_three_ways_is_applied_once() -> None:
    order_id, amount = _event(EVENT)
    before = _paid(order_id)
    assert apply_event.delay(event_id=EVENT).get(timeout=30) == "applied"

    with pytest.raises(ConfigurationError, match="key_override"):
        apply_event.apply_async(kwargs={"event_id": EVENT}, idempotency_key="manual-1")
    forged = _foreign("payments.apply_event.v1", {"event_id": EVENT}, {IDEMPOTENCY_KEY: "forged-1"})
    wait_for(lambda: _finished(forged), timeout=30)

    assert app.AsyncResult(forged).result is None  # skipped: the ledger says done
    assert _paid(order_id) == before + amount


def test_two_tasks_whose_templates_render_the_same_key_keep_their_own_ledger_entries() -> None:
    first = twin_a.delay(call_id="same_1")
    second = twin_b.delay(call_id="same_1")  # published while the first is pending

    assert not second.deduplicated
    assert first.get(timeout=30) == {"ran": "a", "key": "twin:same_1"}
    assert second.get(timeout=30) == {"ran": "b", "key": "twin:same_1"}
    assert twin_b.delay(call_id="same_1").get(timeout=30) is None  # its own entry: done


def test_a_task_that_allows_key_overrides_runs_under_the_key_it_was_given() -> None:
    given = given_key.apply_async(kwargs={"call_id": "g_1"}, idempotency_key="manual:g_1")
    assert given.get(timeout=30) == "manual:g_1"
    forged = _foreign("testing.given_key.v1", {"call_id": "g_2"}, {IDEMPOTENCY_KEY: "hdr:g_2"})
    assert app.AsyncResult(forged).get(timeout=30) == "hdr:g_2"
    state = app.store.key_state("testing.given_key:manual:g_1")
    assert state.ledger_state == "done"


def test_a_different_payload_under_a_pending_key_is_refused_at_the_call_site() -> None:
    first = key_charge.apply_async(kwargs={"call_id": "kc_1", "amount": 100}, countdown=2)
    again = key_charge.delay(call_id="kc_1", amount=100)  # the same payload: deduplicated
    assert again.deduplicated and again.id == first.id

    with pytest.raises(KeyConflict, match="kcharge:kc_1") as refused:
        key_charge.delay(call_id="kc_1", amount=999)

    assert refused.value.key == "testing.key_charge:kcharge:kc_1"
    assert first.get(timeout=30) == 100


def test_a_delivery_whose_key_is_done_with_another_payload_is_dead_lettered_as_conflict() -> None:
    assert key_charge.delay(call_id="kc_2", amount=100).get(timeout=30) == 100

    other = key_charge.delay(call_id="kc_2", amount=999)  # the reservation ended with the job

    record = wait_for(lambda: dead_letter_of(other.id))
    assert record.category is Category.CONFLICT
    assert "kcharge:kc_2" in record.message
    assert app.store.key_state("testing.key_charge:kcharge:kc_2").reserved_by is None
    assert key_charge.delay(call_id="kc_2", amount=100).get(timeout=30) is None  # done: skipped
