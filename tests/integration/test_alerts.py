"""Alerts reach Sentry once, retries never: real envelopes posted to a loopback server.

Sentry is initialised in this process (with the Celery integration and the SDK's default
integrations) before the module's in-process worker starts, so the integration wraps the
jobs exactly as in a real worker. It is torn down at the end of the module.
"""

from __future__ import annotations

import gzip
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
import sentry_sdk
from celery import signals
from celery.app import trace as celery_trace
from celery.worker.consumer import consumer

from conventions import App, bind
from conventions.observability import alerts
from tasks import app
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, wait_for
from tests.integration.support_tracing import log_error

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


def parse_envelope(data: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """The (item header, payload) pairs of a Sentry envelope."""
    items: list[tuple[dict[str, Any], bytes]] = []
    pos = data.find(b"\n") + 1  # past the envelope header
    while 0 < pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end == -1 else end
        if not data[pos:end].strip():
            pos = end + 1
            continue
        header = json.loads(data[pos:end])
        pos = end + 1
        length = header.get("length")
        if length is None:
            end = data.find(b"\n", pos)
            end = len(data) if end == -1 else end
            items.append((header, data[pos:end]))
            pos = end + 1
        else:
            items.append((header, data[pos : pos + length]))
            pos += length + 1
    return items


class Inbox(ThreadingHTTPServer):
    """Receives ``POST /api/1/envelope/``; keeps the events and the discarded counts."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.events: list[dict[str, Any]] = []
        self.discarded: list[dict[str, Any]] = []
        self.paths: set[str] = set()
        self.lock = threading.Lock()

    @property
    def dsn(self) -> str:
        return f"http://public@127.0.0.1:{self.server_address[1]}/1"

    def clear(self) -> None:
        with self.lock:
            self.events.clear()
            self.discarded.clear()


class _Handler(BaseHTTPRequestHandler):
    server: Inbox

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        with self.server.lock:
            self.server.paths.add(self.path)
            for header, payload in parse_envelope(body):
                if header.get("type") == "event":
                    self.server.events.append(json.loads(payload))
                elif header.get("type") == "client_report":
                    self.server.discarded += json.loads(payload).get("discarded_events", [])
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def sentry() -> Iterator[Inbox]:
    inbox = Inbox()
    thread = threading.Thread(target=inbox.serve_forever, daemon=True)
    thread.start()
    assert alerts.init_sentry(inbox.dsn, http_proxy="", https_proxy="")
    with pytest.MonkeyPatch.context() as patch:
        # A worker started earlier in this session imported Celery's consumer module, which
        # keeps its own reference to build_tracer from before Sentry patched it. A real
        # worker imports it after worker_init: give it the patched one, as it would have.
        patch.setattr(consumer, "build_tracer", celery_trace.build_tracer)
        yield inbox
    sentry_sdk.get_client().close(timeout=5)
    sentry_sdk.get_global_scope().set_client(None)  # back to a non-recording client
    inbox.shutdown()
    inbox.server_close()


@pytest.fixture(scope="module")
def thread_worker(sentry: Inbox, thread_worker: Any) -> Any:
    """The shared in-process worker, started after Sentry so that its tasks are wrapped."""
    return thread_worker


@pytest.fixture
def inbox(sentry: Inbox) -> Inbox:
    sentry_sdk.flush(timeout=5)
    sentry.clear()
    return sentry


@pytest.fixture(scope="module")
def provider() -> Iterator[support_jobs.Provider]:
    server = support_jobs.Provider()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    support_jobs.PROVIDER["url"] = server.url
    yield server
    server.shutdown()
    server.server_close()


def _settle(result: Any) -> None:
    """Wait until the job's outcome is stored (after every Sentry capture), then flush."""
    result.get(timeout=30, propagate=False)
    sentry_sdk.flush(timeout=5)  # returns once the transport has posted every envelope


def test_a_bug_produces_exactly_one_sentry_event_tagged_with_the_job(inbox: Inbox) -> None:
    call_id = f"b-{uuid.uuid4().hex[:8]}"
    with bind(correlation_id=f"corr-{call_id}"):
        result = support_jobs.buggy.delay(call_id=call_id)
    record = wait_for(lambda: dead_letter_of(result.id))
    _settle(result)

    assert getattr(support_jobs.buggy, "_sentry_is_patched", False)  # the integration ran
    assert len(inbox.events) == 1, [e.get("logger") or e.get("exception") for e in inbox.events]
    event = inbox.events[0]
    assert event["exception"]["values"][-1]["type"] == "TypeError"
    tags = event["tags"]
    assert tags["task"] == "testing.buggy.v1"
    assert tags["version"] == "v1"
    assert tags["queue"] == "email"
    assert tags["idempotency_key"] == f"buggy:{call_id}"
    assert tags["correlation_id"] == f"corr-{call_id}"
    assert tags["category"] == "bug"
    assert record.id in event["contexts"]["alert"]["message"]
    assert "/api/1/envelope/" in inbox.paths


def test_a_job_that_fails_transiently_then_succeeds_produces_no_sentry_event(
    inbox: Inbox, provider: support_jobs.Provider
) -> None:
    call_id = f"t-{uuid.uuid4().hex[:8]}"
    provider.script[call_id] = [(503, {}), (200, {})]
    with bind(correlation_id=f"corr-{call_id}"):
        result = support_jobs.charge.delay(call_id=call_id)
    assert result.get(timeout=30) == "200"
    _settle(result)

    retried = [e for e in app.store.audit_for(f"corr-{call_id}") if e.event == "retried"]
    assert len(retried) == 1
    assert inbox.events == []


def test_retries_until_exhausted_produce_one_sentry_event_for_the_dead_letter_only(
    inbox: Inbox, provider: support_jobs.Provider
) -> None:
    call_id = f"x-{uuid.uuid4().hex[:8]}"
    provider.script[call_id] = [(503, {})]
    result = support_jobs.charge.delay(call_id=call_id)
    record = wait_for(lambda: dead_letter_of(result.id), timeout=60)
    _settle(result)

    assert record.attempts == support_jobs.FAST.max_attempts
    assert [e["tags"]["category"] for e in inbox.events] == ["exhausted"]
    assert inbox.events[0]["exception"]["values"][-1]["type"] == "HTTPError"


def test_a_permanent_dead_letter_is_logged_but_produces_no_sentry_event(
    inbox: Inbox, provider: support_jobs.Provider, caplog: pytest.LogCaptureFixture
) -> None:
    call_id = f"p-{uuid.uuid4().hex[:8]}"
    provider.script[call_id] = [(404, {})]
    result = support_jobs.charge.delay(call_id=call_id)
    record = wait_for(lambda: dead_letter_of(result.id))
    _settle(result)

    assert inbox.events == []
    # the Celery integration skips the task's ``throws``: no event to drop either
    # a declared outcome: one warning line naming the record, no error line
    assert any(record.id in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert not [r for r in caplog.records if result.id in r.getMessage() and r.levelname == "ERROR"]


def test_an_alert_never_raises_when_sentry_is_broken(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("sentry is down")

    monkeypatch.setattr(sentry_sdk, "capture_exception", broken)
    error = ValueError("a bug")

    alerts.alert("job x dead-lettered", exc=error, tags={"task": "testing.buggy.v1"})

    messages = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "conventions.observability.alerts"
    ]
    assert ("WARNING", "could not send an alert to Sentry") in messages
    assert ("ERROR", "job x dead-lettered") in messages
    assert alerts.is_handled(error)


def test_a_poison_alert_without_an_exception_is_one_message_event_grouped_by_task(
    inbox: Inbox,
) -> None:
    tags = {"task": "testing.crash.v1", "category": "poison", "queue": "email"}

    alerts.alert(
        "testing.crash.v1[t1] dead-lettered as poison (d1): claimed 4 times", exc=None, tags=tags
    )
    sentry_sdk.flush(timeout=5)

    assert len(inbox.events) == 1
    event = inbox.events[0]
    assert event["level"] == "error"
    assert event["tags"]["version"] == "v1"
    assert event["fingerprint"] == ["conventions", "poison", "testing.crash.v1"]


class _Started:
    """What ``worker_init`` and ``beat_init`` send: an object with the app (and the pool
    Celery's Django fixup reads when ``DJANGO_SETTINGS_MODULE`` is set)."""

    pool_cls = "solo"

    def __init__(self, app: Any) -> None:
        self.app = app


def _worker_of(dsn: str) -> _Started:
    """A start of an App whose Sentry DSN is ``dsn`` (its wiring listens for its own)."""
    started = App("sentry-init", set_as_current=False)
    started.conf.update(sentry_dsn=dsn, conventions_doctor_on_start=False)
    return _Started(started)


def test_worker_init_and_beat_init_initialise_sentry_from_the_sentry_dsn_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str | None] = []
    monkeypatch.setattr(alerts, "init_sentry", lambda dsn, **_: calls.append(dsn) or True)
    worker = _worker_of("http://public@127.0.0.1:9/1")

    signals.worker_init.send(sender=worker)
    signals.beat_init.send(sender=worker)
    signals.worker_init.send(sender=_Started(SimpleNamespace(conf={})))  # not ours

    assert calls == ["http://public@127.0.0.1:9/1"] * 2


def test_a_bad_sentry_dsn_is_logged_and_the_worker_starts_without_sentry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = _worker_of("not a dsn")
    client = sentry_sdk.get_client()

    signals.worker_init.send(sender=worker)

    assert sentry_sdk.get_client() is client
    assert any("could not initialise Sentry" in r.getMessage() for r in caplog.records)


def test_an_event_raised_inside_a_job_by_its_own_code_carries_the_jobs_tags(inbox: Inbox) -> None:
    order = f"ord_{uuid.uuid4().hex[:8]}"
    with bind(correlation_id=f"corr-{order}"):
        result = log_error.delay(order_id=order)
    _settle(result)

    [event] = [e for e in inbox.events if order in str(e.get("logentry") or e.get("message"))]
    tags = event["tags"]
    assert tags["correlation_id"] == f"corr-{order}"
    assert (tags["task"], tags["version"], tags["queue"]) == ("testing.log_error.v1", "v1", "email")
    assert tags["idempotency_key"] == f"logerr:{order}"
