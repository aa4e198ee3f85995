"""The worker side of the task contract: real worker, real Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kombu import Connection, Producer

from conventions.cli import main as cli
from conventions.store.records import Category
from conventions.tracing.headers import CORRELATION
from tasks import app
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


def _foreign_publish(task: str, kwargs: dict[str, Any], queue: str = "email") -> str:
    """A message from a foreign producer: raw kombu, Celery protocol 2, no headers of ours."""
    with Connection(app.conf.broker_url) as conn:
        return publish_foreign(Producer(conn), task, kwargs, queue)


def test_a_foreign_message_with_valid_kwargs_runs_under_a_fresh_correlation_id() -> None:
    task_id = _foreign_publish("testing.echo.v1", {"call_id": "foreign_1"})
    result = app.AsyncResult(task_id).get(timeout=30)
    assert result["key"] == "echo:foreign_1"
    assert result["correlation"]


def test_a_foreign_message_with_invalid_kwargs_is_dead_lettered_as_invalid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    task_id = _foreign_publish("testing.echo.v1", {"call_id": "bad id!", "extra": 1})
    record = wait_for(lambda: dead_letter_of(task_id))
    assert record.category is Category.INVALID
    assert "call_id" in record.message and "extra" in record.message
    assert record.headers.get(CORRELATION)
    # a caller waiting on the result gets the failure instead of waiting forever
    with pytest.raises(Exception, match="call_id"):
        app.AsyncResult(task_id).get(timeout=30)
    # and an operator finds it with its field error
    assert cli.main(["-A", "tasks", "dlq", "list", "--category", "invalid", "--json"]) == 0
    listed = {row["task_id"]: row for row in json.loads(capsys.readouterr().out)}
    assert "call_id" in listed[task_id]["message"]
    # the worker keeps serving
    assert support_jobs.echo.delay(call_id="after_bad").get(timeout=30)["call_id"] == "after_bad"


def test_a_v1_message_from_before_the_v2_deploy_still_runs_as_v2() -> None:
    from sqlalchemy import select

    from tasks import db, shop

    task_id = _foreign_publish("email.send_receipt.v1", {"order_id": "ord_0003"})
    assert app.AsyncResult(task_id).get(timeout=30) == "sent"
    with db.transaction() as session:
        sent = session.scalars(
            select(shop.SentEmail).where(shop.SentEmail.order_id == "ord_0003")
        ).all()
    assert len(sent) == 1


def test_the_body_gets_the_model_the_key_and_the_attempt() -> None:
    result = support_jobs.echo.delay(call_id="ctx_1").get(timeout=30)
    assert result == {
        "call_id": "ctx_1",
        "key": "echo:ctx_1",
        "correlation": result["correlation"],
        "attempt": 1,
    }


def test_a_second_run_of_a_done_key_skips_the_body() -> None:
    first = support_jobs.echo.delay(call_id="twice_1")
    first.get(timeout=30)
    again = support_jobs.echo.delay(call_id="twice_1")  # window "until_done": publishes
    assert again.deduplicated is False
    assert again.get(timeout=30) is None  # the ledger says done: body skipped
