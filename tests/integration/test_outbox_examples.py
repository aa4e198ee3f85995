"""The outbox examples, run for real: the FastAPI checkout served by uvicorn, the Django
view through Django's test client, both on the session's PostgreSQL shop database; a
``conventions outbox relay --once`` process publishes, a thread worker sends receipts.

Order ids used here (no other test touches them): ``ord_fa_*``, ``ord_dj_*``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from conventions import ConfigurationError, PayloadError
from conventions.tracing.headers import CORRELATION, REQUEST
from tasks import db
from tasks.receipts import send_receipt
from tests.integration import support_outbox as ob
from tests.integration.helpers import wait_for
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


@pytest.fixture
def checkout() -> Iterator[str]:
    """The FastAPI example under uvicorn on a loopback port; its base URL."""
    ob.reset_outbox()
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "examples.fastapi_outbox:api", "--host"]
    server = subprocess.Popen(
        [*command, "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ob.ROOT,
        env={**os.environ, "PYTHONPATH": str(ob.ROOT)},
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert server.poll() is None, "uvicorn exited"
        try:
            return httpx.get(f"{base}/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, timeout=60, every=0.3)
        yield base
    finally:
        server.terminate()
        server.wait(20)


def _relay_once() -> None:
    done = ob.cli("outbox", "relay", "--once")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_fastapi_checkout_commits_the_order_and_its_receipt_job_together(
    checkout: str,
) -> None:
    order = {"order_id": "ord_fa_1", "customer_id": ob.CUSTOMER, "amount_minor": 990}
    created = httpx.post(
        f"{checkout}/orders", json=order, headers={"X-Request-ID": "req-fa-1"}, timeout=30
    )
    assert created.status_code == 201, created.text
    job = created.json()["receipt_job"]
    (row,) = ob.rows(db.engine())
    assert (row.task_id, row.headers[REQUEST]) == (job, "req-fa-1")

    again = httpx.post(f"{checkout}/orders", json=order, timeout=30)  # same order id
    unknown = httpx.post(
        f"{checkout}/orders", json={**order, "order_id": "ord_fa_2", "customer_id": "x"}
    )
    assert (again.status_code, unknown.status_code) == (409, 409)
    assert len(ob.rows(db.engine())) == 1  # the refused requests left no job behind

    _relay_once()
    wait_for(lambda: ob.receipts_sent("ord_fa_1")["ord_fa_1"] == 1)
    assert ob.receipts_sent("ord_fa_2") == {"ord_fa_2": 0}


@pytest.fixture(scope="module")
def django_client() -> Iterator[Any]:
    """Django configured by the example's settings, the outbox table made by its migration."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_outbox.settings")
    import django
    from django.core.management import call_command
    from django.db import connections
    from django.test import Client

    with db.engine().begin() as conn:  # let Django's migration create the table itself
        conn.execute(sa.text("DROP TABLE IF EXISTS cc_outbox"))
    django.setup()
    call_command("migrate", "django_outbox", verbosity=0)
    yield Client()
    connections.close_all()


def test_the_django_view_commits_the_order_and_its_receipt_job_together(
    django_client: Any,
) -> None:
    order = {"order_id": "ord_dj_1", "customer_id": ob.CUSTOMER, "amount_minor": 450}
    created = django_client.post(
        "/orders", json.dumps(order), content_type="application/json", HTTP_X_REQUEST_ID="req-dj"
    )
    assert created.status_code == 201, created.content
    job = created.json()["receipt_job"]
    (row,) = ob.rows(db.engine(), task_id=job)  # written by Django, read by SQLAlchemy
    assert row.kwargs == {"order_id": "ord_dj_1", "layout": "basic"}
    assert row.headers[REQUEST] == "req-dj" and row.headers[CORRELATION]

    refused = django_client.post(
        "/orders", json.dumps(order), content_type="application/json"
    )  # the same order again
    assert refused.status_code == 409
    assert len(ob.rows(db.engine())) == 1

    _relay_once()
    wait_for(lambda: ob.receipts_sent("ord_dj_1")["ord_dj_1"] == 1)
    assert ob.rows(db.engine(), task_id=job)[0].published_at is not None


def test_the_django_add_writes_in_the_atomic_block_and_refuses_to_commit_alone(
    django_client: Any,
) -> None:
    from django.db import transaction

    from conventions.contrib import django_outbox

    before = len(ob.rows(db.engine()))
    with pytest.raises(RuntimeError, match="declined"), transaction.atomic():
        django_outbox.add(send_receipt, order_id="ord_dj_rollback")
        raise RuntimeError("card declined")
    with pytest.raises(ConfigurationError, match="atomic"):
        django_outbox.add(send_receipt, order_id="ord_dj_alone")
    with pytest.raises(PayloadError, match="order_id"), transaction.atomic():
        django_outbox.add(send_receipt, order_id="not an id")
    assert len(ob.rows(db.engine())) == before
