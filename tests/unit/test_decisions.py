"""The default decision table, extension and its guard rails, without a broker."""

from __future__ import annotations

import email.message
import errno
import http.client
import json
import smtplib
import socket
import ssl
import urllib.error
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from conventions.errors import (
    ConfigurationError,
    PayloadError,
    PermanentError,
    SkipJob,
    TransientError,
    UncertainOutcomeError,
)
from conventions.jobs.decisions import (
    DEFAULT_TABLE,
    DeadLetterDecision,
    Decision,
    DecisionTable,
    RetryDecision,
    Rule,
    SkipDecision,
    http_status,
    named,
    parse_retry_after,
    when,
)
from conventions.store.records import Category

decide = DEFAULT_TABLE.decide


def is_retry(decision: Decision) -> bool:
    return isinstance(decision, RetryDecision)


def is_permanent(decision: Decision) -> bool:
    return decision == DeadLetterDecision(Category.PERMANENT, decision.reason)


def is_bug(decision: Decision) -> bool:
    return decision == DeadLetterDecision(Category.BUG, decision.reason, alert=True)


def mimic(qualified: str, base: type[Exception] = Exception, **attrs: Any) -> type[Exception]:
    """An exception class whose ``__module__`` and ``__qualname__`` say ``qualified``, as
    if imported from that library (which is not installed here)."""
    module, _, qualname = qualified.rpartition(".")
    cls = type(qualname, (base,), dict(attrs))
    cls.__module__ = module
    cls.__qualname__ = qualname
    return cls


class Response:
    """What requests and httpx hang on their status errors: a status and headers."""

    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.headers = headers or {}


RequestsHTTPError = mimic("requests.exceptions.HTTPError", OSError)


def requests_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    exc = RequestsHTTPError(f"{status} Error")
    exc.response = Response(status, headers)  # type: ignore[attr-defined]
    return exc


def urllib_error(status: int, retry_after: str | None = None) -> urllib.error.HTTPError:
    headers = email.message.Message()
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return urllib.error.HTTPError("https://api.example", status, "status", headers, None)


# -- our own outcomes ---------------------------------------------------------------------


def test_a_transient_error_is_retried_after_its_retry_after() -> None:
    assert decide(TransientError("busy", retry_after=7)) == RetryDecision("busy", delay=7.0)


def test_a_transient_error_without_retry_after_uses_the_backoff() -> None:
    assert decide(TransientError("busy")) == RetryDecision("busy", delay=None)


def test_an_uncertain_outcome_is_retried_with_reconcile_first() -> None:
    assert decide(UncertainOutcomeError("charge timed out")) == RetryDecision(
        "charge timed out", reconcile=True
    )


def test_a_permanent_error_is_dead_lettered_as_permanent_without_alert() -> None:
    assert decide(PermanentError("card declined")) == DeadLetterDecision(
        Category.PERMANENT, "card declined"
    )


def test_skip_job_ends_the_job_as_skipped() -> None:
    assert decide(SkipJob("order cancelled")) == SkipDecision("order cancelled")


def test_a_payload_error_is_dead_lettered_as_permanent() -> None:
    assert is_permanent(decide(PayloadError(errors=[{"loc": ("a",), "msg": "x", "type": "y"}])))


def test_a_pydantic_validation_error_is_dead_lettered_as_permanent_without_its_input() -> None:
    class Order(BaseModel):
        amount: int

    with pytest.raises(ValidationError) as caught:
        Order.model_validate({"amount": "secret-value"})
    decision = decide(caught.value)
    assert is_permanent(decision)
    assert "secret-value" not in decision.reason


# -- builtin transport errors -------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError(),  # socket.timeout is an alias of it
        ConnectionError(),
        ConnectionRefusedError(),
        ConnectionResetError(),
        BrokenPipeError(),
        http.client.RemoteDisconnected("closed"),
        http.client.IncompleteRead(b"partial"),
        urllib.error.URLError(ConnectionRefusedError()),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_a_builtin_transport_error_is_retried(exc: BaseException) -> None:
    assert is_retry(decide(exc))


# -- HTTP status errors -------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_a_transient_http_status_is_retried(status: int) -> None:
    assert is_retry(decide(requests_error(status)))
    assert is_retry(decide(urllib_error(status)))


def test_a_404_is_dead_lettered_as_permanent() -> None:
    assert is_permanent(decide(requests_error(404)))
    assert is_permanent(decide(urllib_error(404)))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_a_client_error_status_is_dead_lettered_as_permanent(status: int) -> None:
    assert is_permanent(decide(requests_error(status)))


@pytest.mark.parametrize("status", [405, 410, 413, 418])
def test_any_other_4xx_is_dead_lettered_as_permanent_too(status: int) -> None:
    assert is_permanent(decide(requests_error(status)))


def test_a_urllib_429_honours_retry_after_in_seconds() -> None:
    assert decide(urllib_error(429, "120")) == RetryDecision(
        "urllib.error.HTTPError: HTTP 429 is transient", delay=120.0
    )


def test_a_urllib_503_honours_retry_after_as_an_http_date() -> None:
    at = datetime.now(UTC) + timedelta(seconds=90)
    decision = decide(urllib_error(503, format_datetime(at, usegmt=True)))
    assert isinstance(decision, RetryDecision)
    assert decision.delay is not None
    assert 85 <= decision.delay <= 90


def test_a_requests_style_429_honours_the_response_retry_after_header() -> None:
    decision = decide(requests_error(429, {"Retry-After": "30"}))
    assert isinstance(decision, RetryDecision)
    assert decision.delay == 30.0


def test_a_lowercase_retry_after_header_is_found_too() -> None:
    decision = decide(requests_error(503, {"retry-after": "5"}))
    assert isinstance(decision, RetryDecision)
    assert decision.delay == 5.0


def test_retry_after_is_ignored_for_statuses_other_than_429_and_503() -> None:
    decision = decide(requests_error(502, {"Retry-After": "30"}))
    assert isinstance(decision, RetryDecision)
    assert decision.delay is None


def test_an_httpx_style_status_error_is_classified_by_its_response() -> None:
    HTTPStatusError = mimic("httpx.HTTPStatusError")
    exc = HTTPStatusError("Server error")
    exc.response = Response(503, {"Retry-After": "4"})  # type: ignore[attr-defined]
    assert decide(exc) == RetryDecision("httpx.HTTPStatusError: HTTP 503 is transient", delay=4.0)


def test_an_exception_with_a_status_code_or_status_attribute_is_classified() -> None:
    assert is_retry(decide(mimic("sdk.ApiError", status_code=502)()))
    assert is_permanent(decide(mimic("aiohttp.ClientResponseError", status=403)()))


def test_a_requests_error_without_a_response_is_not_an_http_status() -> None:
    exc = RequestsHTTPError("no response")
    exc.response = None  # type: ignore[attr-defined]
    assert http_status(exc) is None
    assert is_bug(decide(exc))


def test_a_boolean_or_out_of_range_status_is_not_an_http_status() -> None:
    assert http_status(mimic("x.E", status=True)()) is None
    assert http_status(mimic("x.E", status_code=42)()) is None


# -- libraries matched by qualified class name --------------------------------------------

TRANSIENT_LIBRARY_ERRORS = [
    "requests.exceptions.Timeout",
    "requests.exceptions.ConnectionError",
    "httpx.TimeoutException",
    "httpx.NetworkError",
    "httpx.RemoteProtocolError",
    "redis.exceptions.ConnectionError",
    "redis.exceptions.TimeoutError",
    "kombu.exceptions.OperationalError",
    "sqlalchemy.exc.OperationalError",
    "sqlalchemy.exc.DisconnectionError",
    "psycopg.OperationalError",
    "smtplib.SMTPServerDisconnected",
    "celery.exceptions.SoftTimeLimitExceeded",
]


@pytest.mark.parametrize("qualified", TRANSIENT_LIBRARY_ERRORS)
def test_a_library_transport_error_is_retried_by_its_qualified_name(qualified: str) -> None:
    assert is_retry(decide(mimic(qualified)()))


def test_a_subclass_of_a_library_transport_error_is_retried() -> None:
    ReadTimeout = mimic("requests.exceptions.ReadTimeout", mimic("requests.exceptions.Timeout"))
    assert is_retry(decide(ReadTimeout()))


def test_a_same_named_class_from_another_module_is_not_matched() -> None:
    assert is_bug(decide(mimic("myapp.exceptions.Timeout")()))


def test_the_installed_libraries_transport_errors_are_retried() -> None:
    import kombu.exceptions
    import psycopg
    import redis.exceptions
    import sqlalchemy.exc
    from celery.exceptions import SoftTimeLimitExceeded

    for exc in (
        redis.exceptions.ConnectionError(),
        redis.exceptions.TimeoutError(),
        kombu.exceptions.OperationalError(),
        psycopg.OperationalError(),
        sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("gone")),
        sqlalchemy.exc.DisconnectionError(),
        SoftTimeLimitExceeded(),
        smtplib.SMTPServerDisconnected(),
        smtplib.SMTPConnectError(554, b"no"),
    ):
        assert is_retry(decide(exc)), exc


def test_a_sqlalchemy_dbapi_error_is_retried_only_when_the_connection_was_invalidated() -> None:
    import sqlalchemy.exc

    orig = Exception("server closed the connection")
    invalidated = sqlalchemy.exc.DBAPIError("SELECT 1", {}, orig, connection_invalidated=True)
    assert is_retry(decide(invalidated))
    assert is_bug(decide(sqlalchemy.exc.DBAPIError("SELECT 1", {}, orig)))


def test_an_smtp_4xx_reply_is_retried_and_a_5xx_reply_is_permanent() -> None:
    assert is_retry(decide(smtplib.SMTPDataError(451, b"try again later")))
    assert is_permanent(decide(smtplib.SMTPSenderRefused(550, b"no such user", "a@b.c")))


ADDRESS = "someone@example.com"


def recipients_refused(*codes: int) -> smtplib.SMTPRecipientsRefused:
    refused = {f"r{i}.{ADDRESS}": (code, b"refused") for i, code in enumerate(codes)}
    return smtplib.SMTPRecipientsRefused(refused)


def test_a_recipient_refused_with_a_5xx_at_rcpt_is_permanent_and_the_reason_has_no_address() -> (
    None
):
    decision = decide(recipients_refused(550))
    assert is_permanent(decision)
    assert "550" in decision.reason and "example.com" not in decision.reason


def test_a_recipient_refused_with_a_4xx_is_retried_even_next_to_a_5xx() -> None:
    """sendmail raises only when every recipient was refused: on a later attempt the
    4xx ones may get through (and sendmail then returns the 5xx ones, without raising)."""
    assert is_retry(decide(recipients_refused(451)))
    assert is_retry(decide(recipients_refused(550, 452)))
    assert is_permanent(decide(recipients_refused(550, 553)))


def test_a_recipients_refused_without_readable_codes_stays_a_bug() -> None:
    assert is_bug(decide(smtplib.SMTPRecipientsRefused({})))
    assert is_bug(decide(smtplib.SMTPRecipientsRefused({ADDRESS: "odd"})))  # type: ignore[dict-item]


def test_a_sender_refused_at_mail_from_is_classified_by_its_code() -> None:
    assert is_permanent(decide(smtplib.SMTPSenderRefused(550, b"not allowed", ADDRESS)))
    assert is_retry(decide(smtplib.SMTPSenderRefused(451, b"try later", ADDRESS)))


def test_smtp_credentials_refused_are_a_configuration_bug_alerted_not_retried() -> None:
    decision = decide(smtplib.SMTPAuthenticationError(535, b"5.7.8 bad credentials"))
    assert is_bug(decision) and "535" in decision.reason
    assert is_retry(decide(smtplib.SMTPAuthenticationError(454, b"4.7.0 try later")))


@pytest.mark.parametrize(
    "exc",
    [
        socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        OSError(errno.ENETUNREACH, "Network is unreachable"),
        OSError(errno.EHOSTUNREACH, "No route to host"),
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
        ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed"),
        urllib.error.URLError(socket.gaierror(socket.EAI_AGAIN, "dns")),
        urllib.error.URLError(OSError(errno.ENETUNREACH, "unreachable")),
    ],
    ids=lambda exc: f"{type(exc).__name__}-{getattr(exc, 'errno', '')}",
)
def test_a_network_error_outside_connection_error_is_retried(exc: BaseException) -> None:
    assert is_retry(decide(exc))


def test_a_certificate_or_other_os_error_is_not_retried() -> None:
    assert is_bug(decide(ssl.SSLCertVerificationError(1, "certificate verify failed")))
    assert is_bug(decide(OSError(errno.ENOENT, "No such file or directory")))
    assert is_bug(decide(PermissionError(errno.EACCES, "Permission denied")))


MORE_TRANSIENT_LIBRARY_ERRORS = [
    "requests.exceptions.ChunkedEncodingError",
    "urllib3.exceptions.ProtocolError",
    "urllib3.exceptions.TimeoutError",
    "urllib3.exceptions.NewConnectionError",
    "urllib3.exceptions.MaxRetryError",
    "aiohttp.client_exceptions.ClientConnectionError",
    "psycopg2.OperationalError",
    "psycopg2.InterfaceError",
    "django.db.utils.OperationalError",
    "django.db.utils.InterfaceError",
    "sqlalchemy.exc.TimeoutError",
    "redis.exceptions.ReadOnlyError",
    "redis.exceptions.TryAgainError",
    "redis.exceptions.ClusterDownError",
    "redis.exceptions.OutOfMemoryError",
]


@pytest.mark.parametrize("qualified", MORE_TRANSIENT_LIBRARY_ERRORS)
def test_a_library_error_of_an_outage_or_failover_is_retried(qualified: str) -> None:
    assert is_retry(decide(mimic(qualified)()))


def test_the_installed_libraries_outage_errors_are_retried_and_their_data_errors_are_bugs() -> None:
    import django.db.utils
    import psycopg
    import redis.exceptions
    import sqlalchemy.exc
    import urllib3.exceptions

    for exc in (
        django.db.utils.OperationalError("server closed the connection unexpectedly"),
        django.db.utils.InterfaceError("connection already closed"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.MasterDownError("MASTERDOWN"),
        sqlalchemy.exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached"),
        urllib3.exceptions.ProtocolError("Connection aborted."),
        urllib3.exceptions.NewConnectionError(None, "Failed to connect"),  # type: ignore[arg-type]
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.SerializationFailure("could not serialize access"),
    ):
        assert is_retry(decide(exc)), exc
    for exc in (
        django.db.utils.IntegrityError("duplicate key"),
        psycopg.IntegrityError("duplicate key value violates unique constraint"),
        sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key")),
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key"),
        json.JSONDecodeError("Expecting value", "<html>", 0),
        smtplib.SMTPNotSupportedError("STARTTLS extension not supported by server."),
        http.client.BadStatusLine("HTTP/0.9 garbage"),
    ):
        assert is_bug(decide(exc)), exc
    assert is_retry(decide(redis.exceptions.AuthenticationError("invalid password")))


# -- everything else ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc", [TypeError(), KeyError("x"), AttributeError(), ValueError(), ZeroDivisionError()]
)
def test_an_unclassified_exception_is_dead_lettered_as_a_bug_with_an_alert(
    exc: BaseException,
) -> None:
    assert is_bug(decide(exc))


def test_a_bug_reason_names_the_type_but_not_the_message() -> None:
    decision = decide(KeyError("customer@example.com"))
    assert "KeyError" in decision.reason
    assert "customer@example.com" not in decision.reason


# -- extension ----------------------------------------------------------------------------


class RateLimited(Exception):
    pass


class NotFoundAnymore(LookupError):
    pass


def test_a_task_rule_is_placed_before_the_defaults() -> None:
    table = DEFAULT_TABLE.extend(when(ConnectionResetError, SkipDecision("peer went away")))
    assert table.decide(ConnectionResetError()) == SkipDecision("peer went away")
    assert table.names[0] == "ConnectionResetError"
    assert table.names[1:] == DEFAULT_TABLE.names


def test_extend_returns_a_new_table_and_leaves_the_defaults_unchanged() -> None:
    before = DEFAULT_TABLE.names
    table = DEFAULT_TABLE.extend({RateLimited: "transient"})
    assert table is not DEFAULT_TABLE
    assert DEFAULT_TABLE.names == before
    assert is_bug(DEFAULT_TABLE.decide(RateLimited()))


def test_the_mapping_form_declares_transient_permanent_and_skip() -> None:
    table = DEFAULT_TABLE.extend(
        {RateLimited: "transient", NotFoundAnymore: "skip", UnicodeError: "permanent"}
    )
    assert is_retry(table.decide(RateLimited()))
    assert isinstance(table.decide(NotFoundAnymore()), SkipDecision)
    assert is_permanent(table.decide(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")))


def test_the_mapping_form_accepts_a_decision_value() -> None:
    table = DEFAULT_TABLE.extend({RateLimited: RetryDecision("rate limited", delay=60)})
    assert table.decide(RateLimited()) == RetryDecision("rate limited", delay=60)


def test_a_later_extension_wins_over_an_earlier_one() -> None:
    table = DEFAULT_TABLE.extend({RateLimited: "permanent"}).extend({RateLimited: "skip"})
    assert isinstance(table.decide(RateLimited()), SkipDecision)


def test_a_rule_may_decline_and_let_the_next_rule_answer() -> None:
    def only_teapots(exc: BaseException) -> Decision | None:
        return SkipDecision("teapot") if http_status(exc) == 418 else None

    table = DEFAULT_TABLE.extend(Rule(lambda exc: True, only_teapots, "teapots"))
    assert table.decide(requests_error(418)) == SkipDecision("teapot")
    assert is_retry(table.decide(requests_error(503)))
    assert is_bug(table.decide(TypeError()))


def test_a_rule_that_raises_dead_letters_the_job_as_a_bug_naming_the_rule() -> None:
    def broken(exc: BaseException) -> Decision | None:
        raise RuntimeError("oops")

    table = DEFAULT_TABLE.extend(when(RateLimited, broken, "broken rule"))
    decision = table.decide(RateLimited())
    assert is_bug(decision)
    assert "broken rule" in decision.reason


@pytest.mark.parametrize("key", [Exception, BaseException])
def test_mapping_every_exception_is_refused_with_the_fix(key: type[BaseException]) -> None:
    with pytest.raises(ConfigurationError, match="map the specific exception classes"):
        DEFAULT_TABLE.extend({key: "transient"})


def test_a_retry_rule_that_matches_every_exception_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="would retry every exception"):
        DEFAULT_TABLE.extend(
            Rule(lambda exc: True, lambda exc: RetryDecision("always"), "retry all")
        )
    with pytest.raises(ConfigurationError, match="would retry every exception"):
        DEFAULT_TABLE.extend(when(Exception, RetryDecision("always")))


def test_a_catch_all_rule_that_does_not_retry_is_allowed() -> None:
    table = DEFAULT_TABLE.extend(when(lambda exc: True, lambda exc: None, "observer"))
    assert is_bug(table.decide(TypeError()))


def test_an_unknown_outcome_or_key_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="'transient', 'permanent', 'skip'"):
        DEFAULT_TABLE.extend({RateLimited: "retry-please"})
    with pytest.raises(ConfigurationError, match="exception classes"):
        DEFAULT_TABLE.extend({"RateLimited": "transient"})  # type: ignore[dict-item]


def test_decisions_and_tables_are_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        RetryDecision("x").delay = 5  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        DEFAULT_TABLE.rules = ()  # type: ignore[misc]
    assert isinstance(DEFAULT_TABLE.rules, tuple)


def test_the_default_table_reads_top_to_bottom_ours_first() -> None:
    assert DEFAULT_TABLE.names[:4] == [
        "TransientError",
        "UncertainOutcomeError",
        "PermanentError",
        "SkipJob",
    ]
    assert DecisionTable().decide(TransientError()) == DeadLetterDecision(
        Category.BUG, "conventions.errors.TransientError is not classified: a bug", alert=True
    )


# -- RetryDecision-After parsing ------------------------------------------------------------------

NOW = datetime(2026, 1, 15, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 5 ", 5.0),
        ("0", 0.0),
        ("Thu, 15 Jan 2026 12:01:30 GMT", 90.0),
        ("Thu, 15 Jan 2026 11:00:00 GMT", 0.0),  # in the past: no wait
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
    ],
)
def test_retry_after_is_parsed_from_seconds_or_an_http_date(
    value: str | None, seconds: float | None
) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


def test_retry_after_accepts_a_naive_now_as_utc() -> None:
    assert parse_retry_after("Thu, 15 Jan 2026 12:00:10 GMT", now=NOW.replace(tzinfo=None)) == 10.0


def test_named_matches_anywhere_in_the_mro() -> None:
    Base = mimic("lib.errors.Base")
    Child = mimic("app.Child", Base)
    assert named("lib.errors.Base")(Child())
    assert not named("lib.errors.Other")(Child())
