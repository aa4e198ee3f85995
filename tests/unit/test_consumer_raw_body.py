"""What a dead letter keeps of a message the worker cannot run: its raw body."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from types import SimpleNamespace

from conventions.store.records import Category
from conventions.store.sql import SQLStore
from conventions.tracing import headers as hdr
from conventions.worker.consumer import MAX_RAW_BODY, raw_body, record


def _message(body: bytes) -> SimpleNamespace:
    return SimpleNamespace(body=body, content_type="application/json", content_encoding="utf-8")


def test_a_utf8_body_is_kept_as_text_with_its_content_type() -> None:
    kept = raw_body(_message(b'{"event_id": evt_0001'))
    assert kept == {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "size": 21,
        "sha256": hashlib.sha256(b'{"event_id": evt_0001').hexdigest(),
        "kept_bytes": MAX_RAW_BODY,
        "truncated": False,
        "raw_body": '{"event_id": evt_0001',
    }


def test_a_binary_body_is_kept_as_base64() -> None:
    body = b"\x80\x04\x95pickled"
    kept = raw_body(_message(body))
    assert base64.b64decode(kept["raw_body_base64"]) == body
    assert "raw_body" not in kept


def test_a_large_body_is_cut_and_marked_truncated() -> None:
    kept = raw_body(_message(b"x" * (MAX_RAW_BODY * 2)))
    assert kept["size"] == MAX_RAW_BODY * 2
    assert kept["truncated"] is True
    assert len(kept["raw_body"]) <= MAX_RAW_BODY


def test_personal_data_in_a_text_body_is_scrubbed() -> None:
    kept = raw_body(_message(b'{"email": "ann@example.com"}'))
    assert "ann@example.com" not in kept["raw_body"]
    assert "<email>" in kept["raw_body"]


def test_a_record_of_an_unrunnable_message_reads_our_headers_by_type(tmp_path: Path) -> None:
    """Junk in our headers (a nested correlation id, a list as the key) is left out of the
    record's fields, never taken as its correlation or key; the raw headers stay."""
    store = SQLStore(f"sqlite:///{tmp_path / 'store.db'}")
    consumer = SimpleNamespace(app=SimpleNamespace(store=store), hostname="w1@test")
    junk = {
        "task": "payments.apply_event.v1",
        "id": "job-1",
        hdr.CORRELATION: {"nested": "someone@example.com"},
        hdr.IDEMPOTENCY_KEY: ["payment-event:evt_1"],
        hdr.CAUSATION: {"job": "x"},
    }
    message = SimpleNamespace(
        body=b"{not json", content_type="application/json", content_encoding="utf-8",
        headers=junk, delivery_info={"routing_key": "email"},
    )  # fmt: skip
    dead = record(consumer, message, Category.UNPARSEABLE, "cannot decode the body", None)
    assert dead is not None
    assert (dead.idempotency_key, dead.correlation_id == dead.id) == (None, True)
    trail = store.audit_for(dead.id)
    assert [e.event for e in trail] == ["dead_lettered"]
    assert trail[0].causation_id is None
    store.close()
