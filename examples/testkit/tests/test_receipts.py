"""The receipt job, run through the layer's real run path (payload, key, ledger, decisions,
retries, dead letters) by the test kit: no broker, no worker, no sleeping."""

from __future__ import annotations

import pytest
from conventions import PayloadError
from conventions.testing import JobKit

from tasks.mailer import mailer
from tasks.receipts import send_receipt


def test_a_receipt_is_sent_once_under_the_orders_key(cc_kit: JobKit) -> None:
    run = cc_kit.run(send_receipt, order_id="ord_1", customer_id="cus_1")

    assert run.outcome == "succeeded"
    assert run.value == "receipt:ord_1"
    assert run.job.key == "receipt:ord_1"
    assert mailer.sent == {"receipt:ord_1": ("cus_1", "receipt")}
    assert run.event_names == ["started", "succeeded"]


def test_after_three_outages_the_fourth_attempt_sends_it(cc_kit: JobKit) -> None:
    mailer.outage(3)
    send_receipt.delay(order_id="ord_2", customer_id="cus_2")

    runs = cc_kit.drain()

    assert [run.outcome for run in runs] == ["retried", "retried", "retried", "succeeded"]
    assert [run.attempt for run in runs] == [1, 2, 3, 4]
    # the backoff (2 s doubling, half of it jittered, seeded): waited on the virtual clock
    assert [round(run.delay or 0, 2) for run in runs[:3]] == [1.84, 3.52, 5.68]
    assert cc_kit.clock.elapsed == pytest.approx(11.04, abs=0.01)
    assert mailer.sent == {"receipt:ord_2": ("cus_2", "receipt")}


def test_an_unknown_mailbox_is_dead_lettered_at_once(cc_kit: JobKit) -> None:
    mailer.unknown.add("cus_3")

    run = cc_kit.run(send_receipt, order_id="ord_3", customer_id="cus_3")

    assert run.outcome == "dead_lettered"
    assert run.category == "permanent"
    assert run.reason == "tasks.mailer.MailboxUnknown: declared permanent"
    assert "no such mailbox" in str(run.exception)
    (letter,) = cc_kit.dead_letters(send_receipt)
    assert letter.exc_type.endswith("MailboxUnknown")
    assert letter.payload == {"order_id": "ord_3", "customer_id": "cus_3"}
    assert letter.attempts == 1
    cc_kit.assert_not_enqueued(send_receipt)  # no retry
    assert mailer.sent == {}


def test_a_second_delay_of_the_same_order_enqueues_one_job(cc_kit: JobKit) -> None:
    first = send_receipt.delay(order_id="ord_4", customer_id="cus_4")
    second = send_receipt.delay(order_id="ord_4", customer_id="cus_4")

    assert second.deduplicated and second.id == first.id
    (job,) = cc_kit.assert_enqueued(send_receipt, order_id="ord_4")
    assert job.key == "receipt:ord_4"
    assert cc_kit.dedup_hits(send_receipt) == 1
    assert [run.outcome for run in cc_kit.drain()] == ["succeeded"]
    assert len(mailer.sent) == 1


def test_two_orders_of_one_customer_get_two_receipts(cc_kit: JobKit) -> None:
    send_receipt.delay(order_id="ord_5", customer_id="cus_5")
    send_receipt.delay(order_id="ord_6", customer_id="cus_5")

    jobs = cc_kit.assert_enqueued(send_receipt, count=2, customer_id="cus_5")
    assert sorted(job.key or "" for job in jobs) == ["receipt:ord_5", "receipt:ord_6"]
    cc_kit.drain()
    assert sorted(mailer.sent) == ["receipt:ord_5", "receipt:ord_6"]


def test_a_call_without_its_customer_is_refused_and_enqueues_nothing(cc_kit: JobKit) -> None:
    with pytest.raises(PayloadError):
        send_receipt.delay(order_id="ord_7")

    cc_kit.assert_not_enqueued(send_receipt)
