"""Test-only jobs under dependency limits, and a loopback provider that counts calls.

Imported by the capacity tests and by their worker subprocesses (``-I``). The provider
runs in the test process; workers find it through ``CAPACITY_PROVIDER_URL``.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from conventions import Backoff, Id, JobContext, Payload, TransientError
from conventions.contrib import polling as runs
from conventions.store import RedisStore
from tasks import app
from tests.integration.helpers import http_status

#: the test dependencies, declared like a project declares its own in celeryconfig.py
LIMITS: dict[str, Any] = {
    "testing_rate": "5/s",
    "testing_cap": {"concurrency": 2, "lease": 3},
}
app.conf.update(conventions_limits={**(app.conf.get("conventions_limits") or {}), **LIMITS})
app.__dict__.pop("conventions_settings", None)  # read again with the test limits

FAST = Backoff(base=0.2, cap=2.0, max_attempts=5)


class Call(Payload):
    call_id: Id


def _get(path: str) -> int:
    return http_status(f"{os.environ['CAPACITY_PROVIDER_URL']}/{path}", timeout=60)


@app.job(
    "testing.rated_call.v1", payload=Call, key="rated:{call_id}", workload="email",
    backoff=FAST, uses=("testing_rate",),
)  # fmt: skip
def rated_call(payload: Call, ctx: JobContext) -> int:
    return _get(f"rate/{payload.call_id}")


@app.job(
    "testing.capped_call.v1", payload=Call, key="capped:{call_id}", workload="email",
    backoff=FAST, uses=("testing_cap",),
)  # fmt: skip
def capped_call(payload: Call, ctx: JobContext) -> int:
    return _get(f"cap/{payload.call_id}")


@app.job(
    "testing.capped_hold.v1", payload=Call, key="hold:{call_id}", workload="heavy",
    backoff=FAST, uses=("testing_cap",),
)  # fmt: skip
def capped_hold(payload: Call, ctx: JobContext) -> int:
    return _get(f"hold/{payload.call_id}")


@app.job("testing.quick.v1", payload=Call, key="quick:{call_id}", workload="heavy")
def quick(payload: Call, ctx: JobContext) -> str:
    return payload.call_id


class Provider(ThreadingHTTPServer):
    """``/rate/<id>`` answers at once, under a quota: 429 beyond ``quota`` calls in the
    trailing second. ``/cap/<id>`` takes ``cap_seconds``; ``/hold/<id>`` until released.
    Records every call's arrival and the most calls seen in flight at once."""

    daemon_threads = True

    def __init__(self, port: int, quota: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.quota = quota
        self.cap_seconds = 0.3
        self.lock = threading.Lock()
        self.arrivals: list[float] = []
        self.statuses: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        #: answer this many next ``/rate`` calls with 429 and ``Retry-After: retry_after``
        self.refuse_next = 0
        self.retry_after = 1
        self.held = threading.Event()
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def most_in_any_second(self) -> int:
        """The most calls whose arrivals fall in one window of one second."""
        times, most, start = sorted(self.arrivals), 0, 0
        for end, moment in enumerate(times):
            while moment - times[start] >= 1.0:
                start += 1
            most = max(most, end - start + 1)
        return most


class _Handler(BaseHTTPRequestHandler):
    server: Provider

    def do_GET(self) -> None:
        kind = self.path.strip("/").split("/")[0]
        server, now = self.server, time.monotonic()
        with server.lock:
            recent = [t for t in server.arrivals if now - t < 1.0]
            status = 429 if kind == "rate" and len(recent) >= server.quota else 200
            if kind == "rate" and server.refuse_next > 0:
                server.refuse_next -= 1
                status = 429
            server.arrivals.append(now)
            server.statuses.append(status)
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        try:
            if kind == "cap":
                time.sleep(server.cap_seconds)
            elif kind == "hold":
                server.held.set()
                server.release.wait(60)
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", str(server.retry_after))
            self.send_header("Content-Length", "0")
            self.end_headers()
        finally:
            with server.lock:
                server.in_flight -= 1

    def log_message(self, format: str, *args: Any) -> None:
        pass


@app.job(
    "testing.quick_shed.v1", payload=Call, key="shed:{call_id}", workload="heavy",
    overflow="shed",
)  # fmt: skip
def quick_shed(payload: Call, ctx: JobContext) -> str:
    return payload.call_id


# -- fan-out: one parent, one child per tenant --------------------------------------------


class InvoiceRun(Payload):
    batch: Id
    tenants: int


class TenantInvoice(Payload):
    batch: Id
    tenant: Id


def _runs(batch: str) -> str:
    return f"testing:fanout-runs:{batch}"


@app.job("testing.fan_out.v1", payload=InvoiceRun, key="fan-out:{batch}", workload="email")
def fan_out(payload: InvoiceRun, ctx: JobContext) -> int:
    """Publish one child per tenant, each with its own key, and finish at once: a child
    that fails is retried alone, and the parent run again publishes no duplicate."""
    for n in range(payload.tenants):
        invoice_tenant.delay(batch=payload.batch, tenant=f"t{n:02d}")
    _count(_runs(payload.batch), "parent")
    return payload.tenants


@app.job(
    "testing.invoice_tenant.v1", payload=TenantInvoice, key="invoice:{batch}:{tenant}",
    workload="email", backoff=FAST,
)  # fmt: skip
def invoice_tenant(payload: TenantInvoice, ctx: JobContext) -> str:
    """Fails its first attempt for the tenants the test lists in a state document."""
    _count(_runs(payload.batch), payload.tenant)
    failing = app.store.get_state(f"testing:failing:{payload.batch}") or {}
    if ctx.attempt == 1 and payload.tenant in failing.get("tenants", []):
        raise TransientError(f"tenant {payload.tenant}: provider hiccup")
    return payload.tenant


def _count(key: str, field: str) -> None:
    cast(RedisStore, app.store).client.hincrby(key, field, 1)


def runs_of(batch: str) -> dict[str, int]:
    """How many times each tenant's body (and the parent, ``parent``) ran."""
    found = cast(RedisStore, app.store).client.hgetall(_runs(batch))
    return {field: int(count) for field, count in found.items()}


# -- trigger-and-poll ---------------------------------------------------------------------


class Export(Payload):
    export_id: Id


@app.job("testing.export.v1", payload=Export, key="export:{export_id}", workload="email")
def export(payload: Export, ctx: JobContext) -> dict[str, int]:
    """Writes its progress, and waits for the test's go between steps."""
    store = app.store
    for done in range(1, 4):
        store.put_state(runs.progress_name(ctx.task_id), {"done": done, "total": 3}, 600)
        deadline = time.monotonic() + 20
        while not store.get_state(f"testing:go:{payload.export_id}:{done}"):
            if time.monotonic() > deadline:
                raise TransientError("the test never said go")
            time.sleep(0.05)
    return {"rows": 3}


@app.job("testing.reported_export.v1", payload=Export, key="reported:{export_id}", workload="email")
def reported_export(payload: Export, ctx: JobContext) -> dict[str, int]:
    """As ``export``, reporting with ``ctx.progress`` (the store and the result backend's
    ``PROGRESS`` state)."""
    store = app.store
    for done in range(1, 3):
        ctx.progress(done, 2)
        deadline = time.monotonic() + 20
        while not store.get_state(f"testing:go:{payload.export_id}:{done}"):
            if time.monotonic() > deadline:
                raise TransientError("the test never said go")
            time.sleep(0.05)
    return {"rows": 2}
