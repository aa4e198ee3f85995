"""Placing an order writes its receipt job in the order's own transaction (the outbox):
the relay publishes it after a commit, and nothing after a rollback."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from conventions.testing import JobKit

from tasks.orders import place_order
from tasks.receipts import send_receipt


def test_a_committed_order_publishes_its_receipt_through_the_relay(
    cc_kit: JobKit, shop_db: sa.Engine
) -> None:
    with shop_db.begin() as conn:
        place_order(conn, "ord_10", "cus_10")
    cc_kit.assert_not_enqueued(send_receipt)  # nothing reaches the broker before the relay

    assert cc_kit.relay_outbox(shop_db) == 1

    (job,) = cc_kit.assert_enqueued(send_receipt, order_id="ord_10", customer_id="cus_10")
    assert job.key == "receipt:ord_10"
    assert [run.outcome for run in cc_kit.drain()] == ["succeeded"]


def test_a_rolled_back_order_publishes_nothing(cc_kit: JobKit, shop_db: sa.Engine) -> None:
    with pytest.raises(RuntimeError), shop_db.begin() as conn:
        place_order(conn, "ord_11", "cus_11")
        raise RuntimeError("the payment was refused")

    assert cc_kit.relay_outbox(shop_db) == 0
    cc_kit.assert_not_enqueued()
