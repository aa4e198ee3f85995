"""The same job through a real Celery worker (a thread, on Redis databases the tests own:
``CC_TEST_BROKER_URL`` and ``CC_TEST_REDIS_URL``): the integration test."""

from __future__ import annotations

from typing import Any

from tasks.mailer import mailer
from tasks.receipts import send_receipt


def test_a_real_worker_sends_the_receipt(cc_worker: Any) -> None:
    result = send_receipt.delay(order_id="ord_20", customer_id="cus_20")

    assert result.get(timeout=30) == "receipt:ord_20"
    assert mailer.sent == {"receipt:ord_20": ("cus_20", "receipt")}
