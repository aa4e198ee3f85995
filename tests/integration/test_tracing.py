"""One story per request: correlation through retries, child jobs and plain Celery
tasks, in the audit trail and on every log record (in-process thread worker)."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from celery.result import AsyncResult

from conventions import bind
from conventions.cli import main as cli
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration.helpers import wait_for
from tests.integration.support_tracing import flaky_fanout, plain_child, plain_parent

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


def trace_json(correlation: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cli.main(["-A", "tasks", "trace", correlation, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_a_plain_task_published_inside_a_job_inherits_its_story_and_names_it_as_cause() -> None:
    with bind(correlation_id="corr-plain", actor_id="user-7"):
        parent = plain_parent.delay(order_id=f"ord_{uuid.uuid4().hex[:8]}")
    child_id = parent.get(timeout=30)
    seen = AsyncResult(child_id, app=app).get(timeout=30)
    assert seen[hdr.CORRELATION] == "corr-plain"
    assert seen[hdr.CAUSATION] == f"job:{parent.id}"
    assert seen[hdr.ACTOR] == "user-7"
    assert seen[hdr.ENQUEUED_AT]


def test_a_plain_task_published_by_a_script_starts_a_story_of_its_own() -> None:
    first = plain_child.delay().get(timeout=30)
    second = plain_child.delay().get(timeout=30)
    assert len(first[hdr.CORRELATION]) == 32
    assert first[hdr.CORRELATION] != second[hdr.CORRELATION]
    assert first[hdr.CAUSATION] is None


def test_retries_and_children_are_one_story_in_the_trace_and_on_every_log_line(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    order = f"ord_{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.INFO, logger="shop.orders")
    with bind(correlation_id=f"corr-{order}", request_id=f"req-{order}") as trace:
        root = flaky_fanout.delay(order_id=order)
    children = root.get(timeout=60)
    for child in children:
        AsyncResult(child, app=app).get(timeout=30)

    def finished() -> dict[str, Any] | None:
        data = trace_json(trace.correlation_id, capsys)
        [job] = data["jobs"]
        done = [c for c in job["children"] if c["outcome"] == "succeeded"]
        return data if job["outcome"] == "succeeded" and len(done) == 2 else None

    [job] = wait_for(finished, timeout=30)["jobs"]
    assert job["task_id"] == root.id
    assert job["caused_by"] == f"request:{trace.request_id}"
    assert job["attempts"] == 3
    assert [e["event"] for e in job["events"]].count("retried") == 2
    assert sorted(c["task_id"] for c in job["children"]) == sorted(children)
    assert {c["caused_by"] for c in job["children"]} == {f"job:{root.id}"}

    lines = [r for r in caplog.records if r.name == "shop.orders" and order in r.getMessage()]
    assert [r.attempt for r in lines if "attempt" in r.getMessage()] == [1, 2, 3]  # type: ignore[attr-defined]
    for record in lines:
        fields = (record.correlation_id, record.task, record.version, record.task_id)  # type: ignore[attr-defined]
        assert fields == (trace.correlation_id, "testing.flaky_fanout.v1", "v1", root.id)
        assert record.idempotency_key == f"fanout:{order}"  # type: ignore[attr-defined]
