"""Test-only jobs on the reference app, and a scripted HTTP provider on loopback.

Imported by the tests (and by subprocess workers through ``--include``), never by the
reference app itself.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from conventions import Backoff, Id, JobContext, Payload, PermanentError
from tasks import app
from tests.integration.helpers import http_status

#: the provider's base URL, set by the ``provider`` fixture (thread workers share it)
PROVIDER: dict[str, str] = {}
FAST = Backoff(base=0.2, cap=2.0, max_attempts=5)


class Call(Payload):
    call_id: Id


class Provider(ThreadingHTTPServer):
    """Answers ``GET /charge/<call_id>`` from a script: a list of statuses per call id,
    the last one repeated; records every request with its Idempotency-Key."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: dict[str, list[tuple[int, dict[str, str]]]] = {}
        self.seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Provider
    responses: ClassVar[dict[int, str]] = {}

    def do_GET(self) -> None:
        call_id = self.path.rsplit("/", 1)[-1]
        with self.server.lock:
            steps = self.server.script.get(call_id) or [(200, {})]
            status, headers = steps.pop(0) if len(steps) > 1 else steps[0]
            self.server.seen[call_id].append(
                {"key": self.headers.get("Idempotency-Key"), "status": status}
            )
        body = json.dumps({"status": status}).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@app.job("testing.charge.v1", payload=Call, key="charge:{call_id}", workload="email", backoff=FAST)
def charge(payload: Call, ctx: JobContext) -> str:
    """Call the provider once, passing the idempotency key; HTTP errors are classified
    by the default decisions table (503 transient, 404 permanent...)."""
    request = urllib.request.Request(
        f"{PROVIDER['url']}/charge/{payload.call_id}",
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return str(http_status(request, timeout=5))


@app.job("testing.buggy.v1", payload=Call, key="buggy:{call_id}", workload="email")
def buggy(payload: Call, ctx: JobContext) -> None:
    """A defect: an unclassified exception."""
    raise TypeError(f"cannot add str and int for {payload.call_id}")


@app.job("testing.crash.v1", payload=Call, key="crash:{call_id}", workload="email")
def crash(payload: Call, ctx: JobContext) -> None:
    """Kills its own worker process, every time."""
    os._exit(13)


@app.job("testing.echo.v1", payload=Call, key="echo:{call_id}", workload="email")
def echo(payload: Call, ctx: JobContext) -> dict[str, Any]:
    """Returns what it saw, for header and context checks."""
    return {
        "call_id": payload.call_id,
        "key": ctx.idempotency_key,
        "correlation": ctx.correlation_id,
        "attempt": ctx.attempt,
    }


@app.job(
    "testing.stuck.v1",
    payload=Call,
    key="stuck:{call_id}",
    workload="email",
    time_limit=2.0,
    soft_time_limit=1.0,
)
def stuck(payload: Call, ctx: JobContext) -> None:
    """Ignores its soft time limit, so the hard limit kills its process."""
    import time

    from celery.exceptions import SoftTimeLimitExceeded

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            time.sleep(0.1)
        except SoftTimeLimitExceeded:
            continue


@app.job("testing.probe.v1", payload=Call, key="probe:{call_id}", workload="heavy")
def probe(payload: Call, ctx: JobContext) -> str:
    """Runs on the heavy queue at once: the sign that a worker is still fetching."""
    return payload.call_id


def worker_had_its_chance(rounds: int = 2, timeout: float = 30) -> None:
    """The positive signal a "nothing happened on queue X" check waits on: ``rounds``
    probe jobs on the heavy queue, each published after the previous one ran, run by
    the worker under test (it must read ``heavy`` besides the queue checked). After a
    delivery, the layer's Redis transport sweeps every queue the consumer reads, so a job
    published before the first probe on a queue it still read would have been taken
    by the time the second probe ran."""
    for n in range(rounds):
        result = probe.delay(call_id=f"probe-{uuid.uuid4().hex[:8]}-{n}")
        result.get(timeout=timeout)


@app.job("testing.declined.v1", payload=Call, key="declined:{call_id}", workload="email")
def declined(payload: Call, ctx: JobContext) -> None:
    """A declared outcome: the provider refused for good (``permanent``)."""
    raise PermanentError(f"card declined for {payload.call_id}")


@app.job("testing.unstorable.v1", payload=Call, key="unstorable:{call_id}", workload="email")
def unstorable(payload: Call, ctx: JobContext) -> object:
    """Succeeds with a value no result serializer can store."""
    return object()
