"""Publishing from a process that imports a job's contract, not its body (tasks.publishing)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from conventions import App, ConfigurationError, Contract, Id, Payload
from conventions.store.records import Category
from conventions.tracing.headers import CORRELATION, IDEMPOTENCY_KEY
from tests.fixtures import ROOT
from tests.integration.helpers import dead_letter_of, wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

#: what the worker side imports and a publishing process must not
WORKER_ONLY = ("sqlalchemy", "smtplib", "tasks.celery", "tasks.receipts", "tasks.shop", "tasks.db")

PUBLISH = """
import json, sys
from tasks.publishing import send_receipt
from conventions import PayloadError
out = {}
try:
    send_receipt.delay(order_id="bad id!")
except PayloadError as exc:
    out["refused"] = exc.fields
first = send_receipt.delay(order_id=sys.argv[1])
second = send_receipt.delay(order_id=sys.argv[1])
out["first"], out["second"], out["deduplicated"] = first.id, second.id, second.deduplicated
out["loaded"] = sorted(m for m in sys.argv[2].split(",") if m in sys.modules)
print(json.dumps(out))
"""


def _publish(order_id: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PUBLISH, order_id, ",".join(WORKER_ONLY)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_web_process_publishes_through_the_contract_without_the_bodies(
    broker_redis: redis.Redis,
) -> None:
    broker_redis.delete("email")
    order_id = f"ord_pub_{uuid.uuid4().hex[:8]}"
    seen = _publish(order_id)
    assert seen["loaded"] == []
    assert seen["refused"] == ["order_id"]  # validated at the call site, nothing sent
    assert seen["deduplicated"] is True and seen["second"] == seen["first"]
    assert broker_redis.llen("email") == 1
    message = json.loads(broker_redis.lindex("email", 0) or "{}")
    headers = message["headers"]
    assert headers["task"] == "email.send_receipt.v2"
    assert headers["id"] == seen["first"]
    assert headers[IDEMPOTENCY_KEY] == f"receipt:{order_id}"
    assert headers[CORRELATION]
    broker_redis.delete("email")


def test_the_worker_runs_the_body_of_a_job_its_contract_published(thread_worker: Any) -> None:
    order_id = f"ord_pub_{uuid.uuid4().hex[:8]}"  # not in the shop: the body refuses it
    seen = _publish(order_id)
    record = wait_for(lambda: dead_letter_of(seen["first"]), timeout=60)
    assert record.task == "email.send_receipt.v2"
    assert record.category is Category.PERMANENT
    assert f"unknown order {order_id}" in record.message


class Ping(Payload):
    ping_id: Id


@pytest.fixture
def fresh_app() -> Iterator[App]:
    """An app configured like the reference one, closed with its store afterwards."""
    app = App("publisher-test", set_as_current=False)
    app.config_from_object("celeryconfig")
    yield app
    if "_cc_store" in app.__dict__:
        app.store.close()
    app.close()


def test_a_publisher_is_the_job_itself_when_the_app_declares_it(fresh_app: App) -> None:
    app = fresh_app
    contract = Contract("testing.ping.v1", payload=Ping, key="ping:{ping_id}", workload="email")
    publisher = app.publisher(contract)
    assert getattr(publisher, "publisher_only", False) is True

    @app.job(contract)
    def ping(payload: Ping, ctx: Any) -> str:
        return payload.ping_id

    assert app.tasks["testing.ping.v1"] is ping  # the body took the publisher's place
    assert app.publisher(contract) is ping
    assert not getattr(ping, "publisher_only", False)


def test_a_contract_declares_its_publish_options_once(fresh_app: App) -> None:
    app = fresh_app
    contract = Contract("testing.ping.v1", payload=Ping, key="ping:{ping_id}", workload="email")
    with pytest.raises(ConfigurationError, match="the contract declares the payload"):
        app.job(contract, payload=Ping)
    with pytest.raises(ConfigurationError, match="declare them in the Contract"):
        app.job(contract, dedup=None)
    with pytest.raises(ConfigurationError, match="workload 'nowhere' is unknown"):
        app.publisher(
            Contract("testing.ping.v1", payload=Ping, key="p:{ping_id}", workload="nowhere")
        )


def test_a_publisher_whose_body_reaches_a_worker_is_dead_lettered_as_a_bug(
    fresh_app: App,
) -> None:
    """A worker with the contract and no body (the wrong -A): the job is kept, and says why.
    A real worker of an app that has only the publisher, on a queue of its own."""
    from celery.contrib.testing.worker import start_worker

    from conventions.testing.worker import own_event_loop

    app = fresh_app
    # the app declares the lane's queue and route itself (no task_queues, no task_routes)
    app.conf.update(
        conventions_workloads={"orphan": "orphan-lane"}, task_queues=None, task_routes=None
    )
    contract = Contract(
        "testing.orphan.v1", payload=Ping, key="orphan:{ping_id}", workload="orphan"
    )
    publisher = app.publisher(contract)
    with own_event_loop(), start_worker(
        app, pool="threads", concurrency=1, queues=["orphan-lane"],
        perform_ping_check=False, loglevel="WARNING", shutdown_timeout=20,
    ):  # fmt: skip
        handle = publisher.delay(ping_id=f"p_{uuid.uuid4().hex[:8]}")
        record = wait_for(lambda: dead_letter_of(handle.id), timeout=30)
    assert record.category is Category.BUG
    assert record.queue == "orphan-lane"
    assert record.exc_type.endswith("ConfigurationError")
    assert "has its contract but not its body" in record.traceback
