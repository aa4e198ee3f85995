"""What a dead letter keeps of a message the worker cannot run: its raw body."""

from __future__ import annotations

import base64
import hashlib
from types import SimpleNamespace

from conventions.consumer import MAX_RAW_BODY, raw_body


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
