"""One request, one story, through real processes: a FastAPI app under uvicorn, a
prefork worker logging JSON, the ``conventions trace`` command; and a foreign message
with none of our headers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.result import AsyncResult
from kombu import Connection, Exchange, Producer

from tasks import app
from tests.fixtures import ROOT, WorkerProcess
from tests.integration.helpers import wait_for
from tests.isolation import free_port

INCLUDE = "tests.integration.support_jobs,tests.integration.support_tracing"


@pytest.fixture
def web(services: None, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The FastAPI app under a real uvicorn on loopback; yields (base URL, its log)."""
    port = free_port()
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.acceptance.support_web:api",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: _listening(port) or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, log.read_text()
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def trace(correlation: str) -> dict[str, Any] | None:
    done = subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", "trace", correlation, "--json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    return dict(json.loads(done.stdout)) if done.returncode == 0 else None


def test_a_web_request_its_retries_and_its_children_are_one_story_in_trace_and_logs(
    web: tuple[str, Path], worker_process: Callable[..., WorkerProcess]
) -> None:
    base, web_log = web
    worker = worker_process("corr", "email", include=INCLUDE, CONVENTIONS_LOG_FORMAT="json")
    order = f"ord_{uuid.uuid4().hex[:8]}"
    request = urllib.request.Request(
        f"{base}/orders/{order}", method="POST", headers={"X-Request-ID": f"req-{order}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        correlation = response.headers["X-Correlation-ID"]
        root_id = json.loads(response.read())["task_id"]
    children = AsyncResult(root_id, app=app).get(timeout=90)

    def complete() -> dict[str, Any] | None:
        data = trace(correlation)
        if not data:
            return None
        [job] = data["jobs"]
        finished = [c for c in job["children"] if c["outcome"] == "succeeded"]
        return data if job["outcome"] == "succeeded" and len(finished) == 2 else None

    [job] = wait_for(complete, timeout=60, every=1)["jobs"]
    assert (job["task_id"], job["attempts"]) == (root_id, 3)
    assert job["caused_by"] == f"request:req-{order}"
    assert sorted(c["task_id"] for c in job["children"]) == sorted(children)
    assert {c["caused_by"] for c in job["children"]} == {f"job:{root_id}"}

    [web_line] = [r for r in json_lines(web_log) if order in r["message"]]
    assert (web_line["correlation_id"], web_line["request_id"]) == (correlation, f"req-{order}")
    worker.stop()
    ours = {root_id, *children}
    job_lines = [r for r in json_lines(worker.log) if r.get("task_id") in ours]
    assert {r["task_id"] for r in job_lines} == ours
    assert {r["correlation_id"] for r in job_lines} == {correlation}
    attempts = [r["attempt"] for r in job_lines if r["logger"] == "shop.orders"]
    assert attempts[:3] == [1, 2, 3]


def test_a_raw_kombu_message_without_headers_is_traced_under_a_fresh_correlation_id(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    worker = worker_process("raw", "email", include=INCLUDE, CONVENTIONS_LOG_FORMAT="json")
    task_id = str(uuid.uuid4())
    body = {"task": "testing.echo.v1", "id": task_id, "args": [], "kwargs": {"call_id": "raw-1"}}
    with Connection(app.conf.broker_url) as conn:
        Producer(conn).publish(
            body, exchange=Exchange("email", type="direct"), routing_key="email",
            serializer="json",
        )  # fmt: skip
    seen = AsyncResult(task_id, app=app).get(timeout=60)
    correlation = seen["correlation"]
    assert len(correlation) == 32

    data = wait_for(lambda: trace(correlation), timeout=30, every=1)
    [job] = data["jobs"]
    assert (job["task_id"], job["outcome"]) == (task_id, "succeeded")
    assert [e["event"] for e in job["events"]] == ["started", "succeeded"]
    worker.stop()
    lines = [r for r in json_lines(worker.log) if r.get("task_id") == task_id]
    assert lines
    assert {r["correlation_id"] for r in lines} == {correlation}
