"""Records a newer release wrote in the store (its ``v`` above ``formats.RECORDS``) are
shown as "written by a newer release" by the CLI and the console, never misread. Real
Redis store; the newer release is this one with ``formats.RECORDS`` set higher while it
writes."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from conventions.config import formats
from conventions.console import Principal, Role, console_app
from conventions.store.records import AuditEvent, Category, DeadLetter, utcnow
from tasks import app
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("clean_store")

NEWER = "written by a newer release"


def _put_as_a_newer_release(monkeypatch: pytest.MonkeyPatch) -> DeadLetter:
    now = utcnow()
    record = DeadLetter(
        id=uuid.uuid4().hex, task="testing.echo.v1", task_id=str(uuid.uuid4()),
        category=Category.BUG, payload={"call_id": "v2"}, headers={}, idempotency_key=None,
        exc_type="KeyError", message="boom", traceback="", attempts=1,
        first_failed_at=now, last_failed_at=now, worker="w-new", correlation_id="corr-v2",
    )  # fmt: skip
    with monkeypatch.context() as newer:
        newer.setattr(formats, "RECORDS", formats.RECORDS + 1)
        app.store.put_dead_letter(record)
        app.store.add_audit(AuditEvent("started", record.task, record.task_id, "corr-v2"))
    return record


def test_the_store_refuses_a_newer_record_and_reads_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = _put_as_a_newer_release(monkeypatch)
    with pytest.raises(Exception, match=NEWER):
        app.store.get_dead_letter(record.id)
    with pytest.raises(Exception, match=NEWER):
        app.store.audit_for("corr-v2")
    monkeypatch.setattr(formats, "RECORDS", formats.RECORDS + 1)
    assert app.store.get_dead_letter(record.id) == record


def test_the_cli_says_a_record_was_written_by_a_newer_release(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conventions.cli.main import main

    record = _put_as_a_newer_release(monkeypatch)
    for argv in (["dlq", "show", record.id], ["dlq", "list"], ["trace", "corr-v2"]):
        code = main(["-A", "tasks", *argv])
        out, err = capsys.readouterr()
        assert code == 1, (argv, out, err)
        assert err.startswith("conventions: error: ") and NEWER in err, (argv, err)
        assert "Traceback" not in err


@pytest.fixture
def console() -> Iterator[httpx.Client]:
    """The console of the reference app, read-only, served by a real uvicorn in a thread."""
    web = console_app(
        app, authorizer=lambda _: Principal("ops", Role("read-only")), secret=b"s" * 32
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        yield client
    server.should_exit = True
    thread.join(10)


def test_the_console_says_a_record_was_written_by_a_newer_release(
    monkeypatch: pytest.MonkeyPatch, console: httpx.Client
) -> None:
    record = _put_as_a_newer_release(monkeypatch)
    for path in (f"/dead-letters/{record.id}", "/dead-letters"):
        page = console.get(path)
        assert page.status_code == 409, (path, page.text[:300])
        assert NEWER in page.text
