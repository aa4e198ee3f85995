"""Every ``conventions`` command that shows records, over records a hostile producer
filled: a forged newline, ANSI escapes, a carriage return, NUL and a direction override
in every field it controls. Nothing of it may reach the operator's terminal raw: no
control character but the commands' own line breaks, no forged line.

The commands are enumerated from the CLI itself: a new command must be added here,
either with the arguments that make it show the hostile records or as one that shows
none, or the first test fails.

Then hostile input of the operator's, each one line and an exit code, never a
traceback: a store URL at a server that answers but is not Redis (PostgreSQL's port, a
web server, a server that says ``+OK`` to everything), a port past 65535, a JSON payload
nested deeper than the parser goes.
"""

from __future__ import annotations

import os
import re
import socketserver
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import click
import pytest
import sqlalchemy as sa

from conventions.cli import main as cli
from conventions.observability import audit, progress
from conventions.schedules import pauses
from conventions.store import batches as b
from conventions.store import open_store
from conventions.store.records import Category, DeadLetter
from conventions.tracing import headers as hdr
from conventions.transactional import outbox
from tasks import app
from tests.conftest import PG_BASE
from tests.fixtures import ROOT
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("clean_store")

#: a fake log line, a colour, a terminal hyperlink, a carriage return, NUL, an override
FORGED = "[2026-12-02 04:00:00,000: CRITICAL/MainProcess] forged"
HOSTILE = f"evil\n{FORGED}\x1b[31mred\x1b]8;;http://x.test\x07\rnul\x00rtl\u202e"
CORRELATION = f"corr-{uuid.uuid4().hex[:6]}\n{FORGED}\x1b[2J"
TASK_ID = f"hostile-{uuid.uuid4().hex[:8]}"
KEY = f"key\n{FORGED}\x00\x1b[31m"
#: a batch the store holds under a hostile id (``app.batch`` refuses one: the store does not)
BATCH = f"batch\n{FORGED}\x1b[31m"
#: what may reach the terminal: printable text and the commands' own line breaks
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")

#: command path -> arguments showing the hostile records (``{outbox}``: the outbox URL)
SHOWS = {
    "dlq list": ["dlq", "list"],
    "dlq show": ["dlq", "show", "hostile-dl"],
    "trace": ["trace", CORRELATION],
    "runs list": ["runs", "list"],
    "runs show": ["runs", "show", TASK_ID],
    "keys show": ["keys", "show", KEY],
    "status": ["status", TASK_ID],
    "schedule list": ["schedule", "list"],
    "outbox dead": ["outbox", "dead", "--url", "{outbox}"],
    "outbox status": ["outbox", "status", "--url", "{outbox}"],
    "keys clear": ["keys", "clear", KEY, "--reason", "test"],
    "batches list": ["batches", "list"],
    "batches show": ["batches", "show", BATCH],
    "batches end": ["batches", "end", BATCH, KEY, "--outcome", "failed", "--reason", "test"],
}
#: commands that show no record of a producer's (they act, serve, or check the setup)
SHOWS_NONE = {
    "dlq replay", "dlq purge", "dlq poison", "retention", "metrics serve", "queues pause",
    "queues resume", "runs rerun",
    "doctor", "outbox relay", "outbox init", "schedule trigger", "schedule check",
    "schedule pause", "schedule resume", "web", "migrate",
}  # fmt: skip


def _leaves(group: click.Group, prefix: str = "") -> set[str]:
    found = set()
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        found |= _leaves(command, f"{path} ") if isinstance(command, click.Group) else {path}
    return found


def test_every_command_is_known_to_show_hostile_records_or_none() -> None:
    commands = _leaves(cli.cli)
    assert commands == set(SHOWS) | SHOWS_NONE, commands ^ (set(SHOWS) | SHOWS_NONE)


def _hostile_records(tmp_path: Path) -> str:
    """Fill the store (and an outbox database) with hostile records; the outbox URL."""
    store, now = app.store, datetime.now(UTC)
    store.put_dead_letter(DeadLetter(
        id="hostile-dl", task=HOSTILE, task_id=HOSTILE, category=Category.INVALID,
        payload={"order_id": HOSTILE}, headers={hdr.ACTOR: HOSTILE}, idempotency_key=KEY,
        exc_type=HOSTILE, message=HOSTILE, traceback=HOSTILE, attempts=1,
        first_failed_at=now, last_failed_at=now, worker=HOSTILE, queue=HOSTILE,
        correlation_id=CORRELATION,
    ))  # fmt: skip
    headers = {hdr.CORRELATION: CORRELATION, hdr.ACTOR: HOSTILE, hdr.IDEMPOTENCY_KEY: KEY}
    audit.record(store, "published", "testing.echo.v1", TASK_ID, headers)
    audit.record(store, "started", "testing.echo.v1", TASK_ID, headers, attempt=1,
                 detail={"worker": HOSTILE})  # fmt: skip
    audit.record(store, "dead_lettered", "testing.echo.v1", TASK_ID, headers, attempt=1,
                 detail={"reason": HOSTILE, "category": "invalid"})  # fmt: skip
    store.reserve(KEY, HOSTILE, 60)
    store.put_state(progress.progress_name(TASK_ID), {"done": 1, "note": HOSTILE}, 60)
    pauses.pause(app, "daily-sales", actor=HOSTILE, reason="hostile")
    store.create_batch(b.BatchSpec(BATCH, (KEY, HOSTILE)))
    url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"
    engine = sa.create_engine(url)
    outbox.create_table(engine)
    with engine.begin() as conn:
        for failed_at in (now, None):  # one dead row, one failing
            conn.execute(sa.insert(outbox.table).values(
                task_id=str(uuid.uuid4()), task=HOSTILE, kwargs={}, headers={},
                idempotency_key=KEY, created_at=now, attempts=3, next_attempt_at=now,
                last_error=HOSTILE, failed_at=failed_at,
            ))  # fmt: skip
    engine.dispose()
    return url


def test_no_command_prints_a_control_character_or_a_forged_line_from_hostile_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _hostile_records(tmp_path)
    raw = []
    for name, argv in SHOWS.items():
        code = cli.main(["-A", "tasks", *(a.replace("{outbox}", url) for a in argv)])
        out, err = capsys.readouterr()
        assert code == 0, (name, err)
        assert "forged" in out, (name, out)  # the hostile record was shown
        for stream in (out, err):
            if UNSAFE.search(stream) or any(
                line.startswith(FORGED[:20]) for line in stream.splitlines()
            ):
                raw.append((name, stream))
    assert not raw, raw


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("mysql://app:secret@db/app", "(scheme mysql://)"),
        ("redis://:secret@127.0.0.1:6379/notanumber", "must be a number"),
        ("redis://:secret@127.0.0.1:6379/0?db=x", "must be a number"),
    ],
)
def test_a_store_url_no_store_serves_is_one_line_and_exit_two(
    url: str, reason: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(app.conf, "conventions_store_url", url)

    code = cli.main(["-A", "tasks", "dlq", "list"])

    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("conventions: error: conventions_store_url: unsupported store URL")
    assert reason in err and len(err.splitlines()) == 1 and "secret" not in err
    with pytest.raises(ValueError, match="unsupported store URL"):
        open_store(url)


#: what a server that is not Redis answers a Redis client: a web server's refusal, and a
#: reply of Redis's syntax but of no command's shape, to every command
NOT_REDIS = {"http": b"HTTP/1.1 400 Bad Request\r\n\r\n", "ok-to-everything": b"+OK\r\n"}
#: the commands that read the store first, with their arguments
STORE_COMMANDS = {
    "runs list": ["runs", "list"],
    "migrate": ["migrate"],
    "keys show": ["keys", "show", "some-key"],
    "dlq list": ["dlq", "list"],
}
#: a hang guard only: each command answers within its --timeout
HANG_GUARD = 60.0


class Answering(socketserver.BaseRequestHandler):
    """Answers each read with the server's ``answer``, until the client hangs up."""

    def handle(self) -> None:
        answer: bytes = self.server.answer  # type: ignore[attr-defined]
        while self.request.recv(65536):
            self.request.sendall(answer)


@pytest.fixture(scope="module", params=["postgresql", *NOT_REDIS])
def not_redis(request: pytest.FixtureRequest) -> Iterator[str]:
    """``host:port`` of a server that answers, but not as Redis: PostgreSQL's, or a
    plain TCP server of the test's own that answers garbage."""
    if request.param == "postgresql":
        parts = urlsplit(PG_BASE)
        yield f"{parts.hostname}:{parts.port or 5432}"
        return
    server = socketserver.ThreadingTCPServer(("127.0.0.1", free_port()), Answering)
    server.daemon_threads = True
    server.answer = NOT_REDIS[request.param]  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("name", sorted(STORE_COMMANDS))
def test_a_store_that_answers_but_is_not_redis_is_one_line_naming_it_and_exit_3(
    name: str, not_redis: str
) -> None:
    url = f"redis://{not_redis}/0"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONVENTIONS_STORE_URL": url}

    done = subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", "--timeout", "2",
         *STORE_COMMANDS[name]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD, check=False,
    )  # fmt: skip

    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr[-3000:]
    assert done.stderr.startswith(f"conventions: error: the store ({url}) "), done.stderr


@pytest.mark.parametrize("argv", [["web", "--insecure-local"], ["metrics", "serve"]])
def test_a_port_past_65535_is_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["-A", "tasks", *argv, "--port", "99999"])

    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("conventions: error: Invalid value for '--port': 99999")
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_timeout_that_is_not_a_finite_number_is_one_line_and_exit_2(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["-A", "tasks", "--timeout", value, "dlq", "list"])

    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == (
        f"conventions: error: Invalid value for '--timeout': must be a finite number, got "
        f"{value!r} (see conventions --help)\n"
    )


def test_a_payload_nested_deeper_than_the_parser_goes_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    deep = '{"a":' * 3000 + "1" + "}" * 3000

    code = cli.main(["-A", "tasks", "runs", "rerun", "some-job", "--reason", "r",
                     "--payload", deep])  # fmt: skip

    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == "conventions: error: runs rerun: --payload is nested too deep\n"
