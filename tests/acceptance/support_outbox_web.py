"""A web process that dies right after its commit: ``python -m
tests.acceptance.support_outbox_web ORDER_ID``.

It creates the order and adds its receipt job through the outbox in one transaction,
prints the job's task id, then kills itself with SIGKILL: nothing after the commit runs
(no ``.delay()`` could have happened, no cleanup, no atexit).
"""

from __future__ import annotations

import os
import signal
import sys

from conventions import bind
from conventions.transactional import outbox
from tasks import db
from tasks.receipts import send_receipt
from tests.integration.support_outbox import new_order


def main(order_id: str) -> None:
    with bind(correlation_id=f"corr-{order_id}"), db.transaction() as session:
        new_order(session, order_id)
        task_id = outbox.add(session, send_receipt, order_id=order_id)
    print(task_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1])
