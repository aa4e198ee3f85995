"""A message written by a newer release than the worker reads (its ``cc_format`` header)
is dead-lettered before anything runs, with a reason naming both versions, and replays
once the worker reads that version. Real worker (threads), real Redis; the newer
producer is a raw kombu publish that reserves its key as the layer's ``.delay()`` does.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kombu import Connection, Producer

from conventions.config import formats
from conventions.ops.replay import replay
from conventions.store import keys
from conventions.store.records import Category
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration import support_jobs, support_tracing
from tests.integration.helpers import dead_letter_of, publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


def _sent_by_a_release_with(version: Any, call_id: str) -> tuple[str, str]:
    """``.delay()`` as a release writing header format ``version`` would: the key
    reserved for the job id, then the message with the key and the format headers.
    Returns the job id and the store key."""
    echo = support_jobs.echo
    bare = echo.key_for(echo.payload.parse({"call_id": call_id}))
    key = keys.namespaced(echo.name, bare)
    task_id = str(uuid.uuid4())
    assert app.store.reserve(key, task_id, 3600.0) is None
    with Connection(app.conf.broker_url) as conn:
        publish_foreign(
            Producer(conn), echo.name, {"call_id": call_id}, "email",
            headers={hdr.IDEMPOTENCY_KEY: bare, hdr.FORMAT: version}, task_id=task_id,
        )  # fmt: skip
    return task_id, key


def test_a_newer_format_is_dead_lettered_unrun_and_replays_once_the_worker_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    newer = formats.HEADERS + 1
    task_id, key = _sent_by_a_release_with(newer, "format_1")
    record = wait_for(lambda: dead_letter_of(task_id), timeout=60)
    assert record.category is Category.NEWER_FORMAT
    assert record.exc_type == "NewerFormat"
    assert f"version {newer}" in record.message
    assert f"reads up to {formats.HEADERS}" in record.message
    assert "replay once the fleet runs the new release" in record.message
    assert record.payload == {"call_id": "format_1"}  # kept whole: it replays
    assert record.headers[hdr.FORMAT] == newer
    # nothing ran: no ledger entry, the caller's result says FAILURE, no ``started``
    state = app.store.key_state(key)
    assert state.ledger_state is None
    assert state.reserved_by is None  # given back: the replay is not deduplicated
    # the caller's FAILURE is stored after the dead letter (Consumer.refuse): wait for it
    wait_for(lambda: app.AsyncResult(task_id).state == "FAILURE", timeout=30)
    assert record.correlation_id
    events = [e.event for e in app.store.audit_for(record.correlation_id) if e.task_id == task_id]
    assert "started" not in events and "dead_lettered" in events
    # the fleet now runs the release that reads it: the replay is published and runs
    monkeypatch.setattr(formats, "HEADERS", newer)
    again = replay(app, record.id, reason="fleet upgraded", actor="test")
    assert again.deduplicated is False
    assert again.get(timeout=60)["call_id"] == "format_1"


def test_a_message_of_this_format_or_without_one_runs_as_before() -> None:
    for version, call_id in ((formats.HEADERS, "format_2"), (None, "format_3")):
        task_id, _ = _sent_by_a_release_with(version, call_id)
        assert app.AsyncResult(task_id).get(timeout=60)["call_id"] == call_id
        assert dead_letter_of(task_id) is None


def test_a_format_header_that_is_no_version_is_read_as_a_foreign_message() -> None:
    task_id, _ = _sent_by_a_release_with("not-a-version", "format_4")
    assert app.AsyncResult(task_id).get(timeout=60)["call_id"] == "format_4"


def test_every_publish_carries_the_format_of_this_release() -> None:
    """A plain Celery task too (the publish hook stamps every message of the app)."""
    seen = support_tracing.plain_child.delay().get(timeout=60)
    assert seen[hdr.FORMAT] == formats.HEADERS
