"""The scrubber of exception text: what ``scrubbed`` raises to Celery, and the log formats."""

from __future__ import annotations

import json
import logging
import pickle
import smtplib
import traceback
import uuid

import pytest

from conventions import PermanentError
from conventions.observability import alerts
from conventions.tracing import logs
from conventions.tracing.scrubbing import ScrubbedError, scrub_event, scrub_text, scrubbed

ADDRESS = "someone@example.com"


def raised(exc: BaseException) -> BaseException:
    """``exc`` after a raise, with its traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_an_exception_with_nothing_to_scrub_is_returned_as_it_is() -> None:
    exc = raised(ValueError("order ord_1 has no lines"))
    assert scrubbed(exc) is exc


def test_a_refused_recipient_is_rebuilt_as_the_same_type_with_the_address_scrubbed() -> None:
    exc = raised(smtplib.SMTPRecipientsRefused({ADDRESS: (550, f"<{ADDRESS}> unknown".encode())}))
    copy = scrubbed(exc)
    assert type(copy) is smtplib.SMTPRecipientsRefused
    assert copy.recipients == {"<email>": (550, b"<<email>> unknown")}
    assert "example.com" not in repr(copy) + str(copy)
    assert copy.__traceback__ is exc.__traceback__  # where it failed is kept
    assert pickle.loads(pickle.dumps(copy)).args == copy.args


def test_a_class_that_cannot_be_rebuilt_becomes_a_scrubbed_error_naming_it() -> None:
    class Refused(Exception):
        def __init__(self, recipient: str, *, code: int) -> None:
            super().__init__(f"{code} for {recipient}")

    copy = scrubbed(raised(Refused(ADDRESS, code=550)))
    assert isinstance(copy, ScrubbedError)
    assert copy.original.endswith(
        "test_a_class_that_cannot_be_rebuilt_becomes_a_scrubbed_error_naming_it.<locals>.Refused"
    )
    assert copy.message == "550 for <email>"
    assert ScrubbedError(*copy.args).args == copy.args  # Celery rebuilds it as cls(*args)


def test_a_cause_with_an_address_is_scrubbed_and_the_raw_context_never_printed() -> None:
    try:
        try:
            raise smtplib.SMTPRecipientsRefused({ADDRESS: (550, b"unknown")})
        except smtplib.SMTPRecipientsRefused as inner:
            raise PermanentError("the mailbox was refused") from inner
    except PermanentError as exc:
        try:  # what the runner does: raise the copy inside the except block
            raise scrubbed(exc)
        except PermanentError as seen:
            text = "".join(traceback.format_exception(seen))
    assert "example.com" not in text
    assert "SMTPRecipientsRefused: {'<email>'" in text
    assert "PermanentError: the mailbox was refused" in text


def test_a_note_with_an_address_is_scrubbed_too() -> None:
    exc = raised(ValueError("no such mailbox"))
    exc.add_note(f"while sending to {ADDRESS}")
    text = "".join(traceback.format_exception(scrubbed(exc)))
    assert "example.com" not in text and "while sending to <email>" in text


def test_the_layers_reported_mark_travels_with_the_copy() -> None:
    exc = raised(RuntimeError(f"no mailbox {ADDRESS}"))
    alerts.mark_handled(exc)
    assert alerts.is_handled(scrubbed(exc))


def test_an_exception_whose_str_raises_is_not_a_crash() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("broken __str__")

    assert isinstance(scrubbed(raised(Broken(ADDRESS))), BaseException)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"to {ADDRESS}", "to <email>"),
        ("card 4111 1111 1111 1111 refused", "card <number> refused"),
        ("card=4111-1111-1111-1111", "card=<number>"),
        ("password=hunter2 rest", "password=<redacted> rest"),
        ("redis://user:s3cret@host:6379/0", "redis://user:<redacted>@host:6379/0"),
    ],
)
def test_personal_data_and_secrets_are_replaced(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


def test_ids_are_left_alone() -> None:
    ids = ["12345678-1234-1234-1234-123456789012", uuid.uuid4().hex, "ord_000123", "v2"]
    assert [scrub_text(i) for i in ids] == ids


def test_a_sentry_event_is_scrubbed_everywhere_keys_included() -> None:
    event = {"exception": {"values": [{"value": ADDRESS}]}, "extra": {ADDRESS: [ADDRESS, 3]}}
    assert "example.com" not in json.dumps(scrub_event(event))
    assert scrub_event({"n": 3, "ok": True}) == {"n": 3, "ok": True}


# -- the log formats ---------------------------------------------------------------------


def record(level: int, message: str, with_exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if with_exc:
        exc = raised(smtplib.SMTPRecipientsRefused({ADDRESS: (550, b"unknown")}))
        exc_info = (type(exc), exc, exc.__traceback__)
    return logging.LogRecord("t", level, __file__, 1, message, None, exc_info)


@pytest.mark.parametrize("kind", logs.FORMATS)
def test_a_warning_and_an_exception_are_written_scrubbed(kind: str) -> None:
    formatter = logs.formatter(kind)
    warning = formatter.format(record(logging.WARNING, f"attempt 1 failed for {ADDRESS}"))
    failure = formatter.format(record(logging.ERROR, "raised unexpected", with_exc=True))
    assert "example.com" not in warning + failure
    assert "<email>" in warning and "SMTPRecipientsRefused" in failure


@pytest.mark.parametrize("kind", logs.FORMATS)
def test_celerys_retry_line_is_written_scrubbed_at_info_level(kind: str) -> None:
    from celery.app.trace import LOG_RETRY

    line = record(logging.INFO, LOG_RETRY)
    line.args = {"name": "email.x.v1", "id": "t1", "exc": f"Retry in 2s: refused {ADDRESS}"}
    assert "example.com" not in logs.formatter(kind).format(line)


@pytest.mark.parametrize("kind", logs.FORMATS)
def test_an_info_line_is_written_as_it_is(kind: str) -> None:
    line = logs.formatter(kind).format(record(logging.INFO, "order 4111111111111111 received"))
    assert "4111111111111111" in line


def test_the_scrubbed_error_is_raised_outside_the_conventions_tree() -> None:
    from conventions.errors import ConventionsError

    assert not issubclass(ScrubbedError, ConventionsError)  # no outcome, no layer fault
