"""The one escaping of what reaches a log line or a terminal."""

from __future__ import annotations

import logging
import sys

from conventions.tracing import logs
from conventions.tracing.escaping import escape


def test_every_control_character_is_shown_as_an_escape() -> None:
    text = "a\nb\r\x1b[31mc\x00d\x7f\x85\u202e\u2028\te"
    assert escape(text) == "a\\nb\\r\\x1b[31mc\\x00d\\x7f\\x85\\u202e\\u2028\\te"
    assert escape("line\nnext\x1b", newlines=False) == "line\nnext\\x1b"
    assert escape("plain text, accents é and emoji 🎉") == "plain text, accents é and emoji 🎉"


def test_the_text_format_keeps_a_record_on_one_line_with_an_escaped_traceback_message() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "got %s", ("a\nb\x1b",), None)
    try:
        raise ValueError("bad\n[2026: CRITICAL/MainProcess] forged")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = logs.TextFormatter().format(record)
    first, *rest = line.splitlines()
    assert first.endswith("got a\\nb\\x1b")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: bad\\n[2026: CRITICAL/MainProcess] forged"
