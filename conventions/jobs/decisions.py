"""What happens to a job whose body raised: a closed set of decisions, as frozen values.

An exception goes in, exactly one decision comes out: ``RetryDecision`` (an optional delay, a
reconcile flag), ``DeadLetterDecision`` (a category; bugs alert) or ``SkipDecision``. A
``DecisionTable`` is an ordered, immutable tuple of ``Rule``s: the first rule that
answers wins, and whatever no rule answers is a bug, dead-lettered with an alert and
never retried. Retrying unknown exceptions hides defects and repeats side effects, so a
rule that would retry every exception is refused when the table is built.

Well-known libraries are recognised without importing them: HTTP errors by duck typing
(``.response.status_code``, ``.status_code``, ``.status``) and transport errors by the
qualified class names in the exception's MRO.

Reasons name exception types and status codes, never exception messages (they may hold
personal data; the scrubbed exception travels to the dead letter separately). Only our
own ``JobOutcome`` messages, written on purpose by the job body, are used as reasons.
"""

from __future__ import annotations

import errno
import socket
import ssl
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.client import IncompleteRead, RemoteDisconnected
from typing import Literal

from pydantic import ValidationError

from conventions.errors import (
    BackendUnavailable,
    ConfigurationError,
    PayloadError,
    PermanentError,
    SkipJob,
    TransientError,
    UncertainOutcomeError,
)
from conventions.jobs.http_errors import RETRY_AFTER_STATUSES, RETRY_STATUSES, safe_attr

# re-exported: the HTTP readers moved to conventions.jobs.http_errors, callers import them here
from conventions.jobs.http_errors import http_status as http_status  # noqa: PLC0414
from conventions.jobs.http_errors import parse_retry_after as parse_retry_after  # noqa: PLC0414
from conventions.jobs.http_errors import retry_after_header as retry_after_header  # noqa: PLC0414
from conventions.store.records import Category


@dataclass(frozen=True)
class RetryDecision:
    """Run the job again later."""

    reason: str
    delay: float | None = None  #: seconds to wait at least; None: the task's backoff
    reconcile: bool = False  #: the next attempt runs the task's reconcile step first


@dataclass(frozen=True)
class DeadLetterDecision:
    """Stop: keep the job as a dead letter, for triage and replay."""

    category: Category
    reason: str
    alert: bool = False  #: report it as an alert (True for bugs)


@dataclass(frozen=True)
class SkipDecision:
    """End the job as skipped: not a failure, nothing retried or alerted."""

    reason: str


Decision = RetryDecision | DeadLetterDecision | SkipDecision
Matcher = Callable[[BaseException], bool]
Decider = Callable[[BaseException], Decision | None]
#: what ``when`` matches on: exception classes, or a matcher
Match = type[BaseException] | tuple[type[BaseException], ...] | Matcher
#: the values of ``DecisionTable.extend``'s mapping form (a decision value works too)
Outcome = Literal["transient", "permanent", "skip"]


@dataclass(frozen=True)
class Rule:
    """One row of a table: when ``match`` accepts the exception, ``decide`` answers (or
    returns None, "not mine after all", and the next rule is asked)."""

    match: Matcher
    decide: Decider
    name: str

    def apply(self, exc: BaseException) -> Decision | None:
        return self.decide(exc) if self.match(exc) else None


def when(match: Match, decide: Decision | Decider, name: str | None = None) -> Rule:
    """A rule from exception classes or a matcher, and a fixed decision or a decider.
    The name defaults to the classes' names (or the matcher's ``__name__``)."""
    if isinstance(match, type | tuple):
        types = match if isinstance(match, tuple) else (match,)
        name = name or ", ".join(t.__qualname__ for t in types)
        match = _instance_of(types)
    name = name or str(getattr(match, "__name__", repr(match)))
    if isinstance(decide, RetryDecision | DeadLetterDecision | SkipDecision):
        fixed: Decision = decide
        return Rule(match, lambda _exc: fixed, name)
    return Rule(match, decide, name)


def _instance_of(types: tuple[type[BaseException], ...]) -> Matcher:
    return lambda exc: isinstance(exc, types)


def qualified_names(exc: BaseException) -> frozenset[str]:
    """``module.QualName`` of every class in ``exc``'s MRO."""
    return frozenset(f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__)


def named(*names: str) -> Matcher:
    """Match exceptions with any of ``names`` (``"redis.exceptions.ConnectionError"``)
    anywhere in their MRO: a library's errors, recognised without importing it."""
    wanted = frozenset(names)
    return lambda exc: not wanted.isdisjoint(qualified_names(exc))


def _label(exc: BaseException) -> str:
    cls = type(exc)
    builtin = cls.__module__ == "builtins"
    return cls.__qualname__ if builtin else f"{cls.__module__}.{cls.__qualname__}"


def _retry(what: str) -> Decider:
    return lambda exc: RetryDecision(f"{_label(exc)}: {what}")


def _http(exc: BaseException) -> Decision | None:
    status = http_status(exc)
    if status is None:
        return None
    if status in RETRY_STATUSES or 500 <= status <= 599:
        header = retry_after_header(exc) if status in RETRY_AFTER_STATUSES else None
        return RetryDecision(
            f"{_label(exc)}: HTTP {status} is transient", parse_retry_after(header)
        )
    if 400 <= status <= 499:
        # 400/401/403/404/409/422 are permanent by nature. Every other 4xx (405, 410, 413,
        # ...) is dead-lettered as permanent too: a client error does not fix itself by
        # waiting, and a retry only repeats the same request.
        return DeadLetterDecision(
            Category.PERMANENT, f"{_label(exc)}: HTTP {status} is a client error"
        )
    return None  # 1xx-3xx on an exception: not for us to judge; it ends up a bug


# -- other libraries, by qualified class name --------------------------------------------

TRANSIENT_NAMES = frozenset(
    {
        *("requests.exceptions.Timeout", "requests.exceptions.ConnectionError"),
        "requests.exceptions.ChunkedEncodingError",  # the connection broke mid-body
        *("httpx.TimeoutException", "httpx.NetworkError", "httpx.RemoteProtocolError"),
        *("urllib3.exceptions.ProtocolError", "urllib3.exceptions.TimeoutError"),
        *("urllib3.exceptions.NewConnectionError", "urllib3.exceptions.MaxRetryError"),
        "aiohttp.client_exceptions.ClientConnectionError",
        *("redis.exceptions.ConnectionError", "redis.exceptions.TimeoutError"),
        # a failover in progress: a replica that is read-only, a cluster re-electing
        *("redis.exceptions.ReadOnlyError", "redis.exceptions.TryAgainError"),
        *("redis.exceptions.ClusterDownError", "redis.exceptions.OutOfMemoryError"),
        "kombu.exceptions.OperationalError",
        # database outages: psycopg 3 and 2, Django's wrappers, SQLAlchemy's (and its pool)
        *("psycopg.OperationalError", "psycopg2.OperationalError", "psycopg2.InterfaceError"),
        *("django.db.utils.OperationalError", "django.db.utils.InterfaceError"),
        *("sqlalchemy.exc.OperationalError", "sqlalchemy.exc.DisconnectionError"),
        "sqlalchemy.exc.TimeoutError",
        *("smtplib.SMTPServerDisconnected", "smtplib.SMTPConnectError"),
    }
)
#: Celery re-exports billiard's class: both names are matched
SOFT_TIME_LIMIT = (
    "celery.exceptions.SoftTimeLimitExceeded",
    "billiard.exceptions.SoftTimeLimitExceeded",
)


def _invalidated_connection(exc: BaseException) -> bool:
    return (
        named("sqlalchemy.exc.DBAPIError")(exc) and safe_attr(exc, "connection_invalidated") is True
    )


#: ``OSError`` numbers of a network that is down or unreachable (not ``ConnectionError``s)
NETWORK_ERRNOS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN})
#: TLS errors of a connection cut mid-stream (a certificate failure is not one of them)
TLS_CUT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


def _network(exc: BaseException) -> bool:
    """A network failure the builtin classes do not group: DNS (``socket.gaierror``, a
    resolver outage looks like an unknown name too), an unreachable network or host,
    a TLS stream cut short."""
    if isinstance(exc, (socket.gaierror, *TLS_CUT)):
        return True
    return type(exc) is OSError and exc.errno in NETWORK_ERRNOS


def _url_transport(exc: BaseException) -> bool:  # urllib wraps socket errors in URLError
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else None
    return isinstance(reason, TimeoutError | ConnectionError) or (
        isinstance(reason, BaseException) and _network(reason)
    )


def _smtp(exc: BaseException) -> Decision | None:
    code = safe_attr(exc, "smtp_code")
    if isinstance(code, int) and 400 <= code <= 499:
        return RetryDecision(f"{_label(exc)}: SMTP {code} is transient")
    if isinstance(code, int) and 500 <= code <= 599:
        return DeadLetterDecision(Category.PERMANENT, f"{_label(exc)}: SMTP {code} is permanent")
    return None


def _smtp_auth(exc: BaseException) -> Decision | None:
    """Credentials refused (5xx) fail every job alike: a configuration fault to alert on,
    not a permanent failure of this one job. A 454 (temporary) is retried."""
    code = safe_attr(exc, "smtp_code")
    if isinstance(code, int) and 500 <= code <= 599:
        reason = f"{_label(exc)}: SMTP {code}, the credentials were refused: fix the settings"
        return DeadLetterDecision(Category.BUG, reason, alert=True)
    return _smtp(exc)


def _smtp_recipients(exc: BaseException) -> Decision | None:
    """``SMTPRecipientsRefused`` (every recipient refused at RCPT TO) holds a
    ``{address: (code, message)}`` dict: any 4xx is worth another attempt (those
    recipients may get through, and ``sendmail`` then returns the others without
    raising); all 5xx is permanent. The reason names codes, never addresses."""
    replies = safe_attr(exc, "recipients")
    values = list(replies.values()) if isinstance(replies, dict) else []
    if not values or not all(isinstance(v, tuple) and v and _is_code(v[0]) for v in values):
        return None  # no codes to judge by: not for us, it ends up a bug
    codes = sorted({v[0] for v in values})
    if any(400 <= code <= 499 for code in codes):
        return RetryDecision(
            f"{_label(exc)}: SMTP {_codes(codes, 400)} for a recipient is transient"
        )
    return DeadLetterDecision(
        Category.PERMANENT, f"{_label(exc)}: SMTP {_codes(codes, 500)} is permanent"
    )


def _is_code(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599


def _codes(codes: list[int], hundred: int) -> str:
    return "/".join(str(code) for code in codes if hundred <= code < hundred + 100)


def _validation(exc: BaseException) -> Decision | None:
    if not isinstance(exc, ValidationError):
        return None
    detail = f"{exc.error_count()} validation error(s) for {exc.title}"
    return DeadLetterDecision(Category.PERMANENT, f"{_label(exc)}: {detail}")


# -- the table ---------------------------------------------------------------------------

_PROBES: tuple[BaseException, ...] = (Exception(), TypeError())


def _refuse_catch_all_retry(rule: Rule) -> None:
    """A rule that matches a plain ``Exception()`` and a ``TypeError()`` and retries them
    would retry every bug: refuse it when the table is built, not in production."""
    try:
        if not all(rule.match(probe) for probe in _PROBES):
            return
        answers = [rule.decide(probe) for probe in _PROBES]
    except Exception as err:
        raise ConfigurationError(
            f"decision rule {rule.name!r} raised {type(err).__name__} on a plain exception: "
            "a matcher must return a bool, and a decider a decision or None, for any exception"
        ) from err
    if any(isinstance(answer, RetryDecision) for answer in answers):
        raise ConfigurationError(
            f"decision rule {rule.name!r} would retry every exception, bugs included: match "
            "only the exception classes that are transient (unmatched exceptions are "
            "dead-lettered as bugs, with an alert, on purpose)"
        )


_OUTCOMES: dict[str, Decider] = {
    "transient": _retry("declared transient"),
    "permanent": lambda exc: DeadLetterDecision(
        Category.PERMANENT, f"{_label(exc)}: declared permanent"
    ),
    "skip": lambda exc: SkipDecision(f"{_label(exc)}: declared skip"),
}


def _mapping_rule(exc_type: object, outcome: object) -> Rule:
    if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
        raise ConfigurationError(f"decision keys must be exception classes, not {exc_type!r}")
    if exc_type in (Exception, BaseException):
        raise ConfigurationError(
            f"a decision for {exc_type.__name__} would decide every exception, bugs "
            "included: map the specific exception classes instead"
        )
    if isinstance(outcome, RetryDecision | DeadLetterDecision | SkipDecision):
        return when(exc_type, outcome, f"{exc_type.__qualname__} -> {outcome!r}")
    if not isinstance(outcome, str) or outcome not in _OUTCOMES:
        raise ConfigurationError(
            f"decision for {exc_type.__qualname__} is {outcome!r}: use 'transient', "
            "'permanent', 'skip', or a RetryDecision / DeadLetterDecision / SkipDecision value"
        )
    return when(exc_type, _OUTCOMES[outcome], f"{exc_type.__qualname__} -> {outcome}")


@dataclass(frozen=True)
class DecisionTable:
    """An ordered, immutable tuple of rules: the first rule that answers wins."""

    rules: tuple[Rule, ...] = ()

    def __post_init__(self) -> None:
        for rule in self.rules:
            if not isinstance(rule, Rule):
                raise ConfigurationError(f"a decision table holds Rule values, not {rule!r}")
            _refuse_catch_all_retry(rule)

    def decide(self, exc: BaseException) -> Decision:
        """The decision for ``exc``; what no rule answers is a bug (dead letter, alert).

        A rule that raises is itself a bug: the job is dead-lettered with an alert naming
        the rule, rather than crash the worker's failure path.
        """
        for rule in self.rules:
            try:
                decision = rule.apply(exc)
            except Exception as err:
                reason = f"decision rule {rule.name!r} raised {type(err).__name__}"
                return DeadLetterDecision(Category.BUG, f"{reason} on {_label(exc)}", alert=True)
            if decision is not None:
                return decision
        return DeadLetterDecision(
            Category.BUG, f"{_label(exc)} is not classified: a bug", alert=True
        )

    def extend(self, *rules: Rule | Mapping[type[BaseException], str | Decision]) -> DecisionTable:
        """A NEW table with ``rules`` placed before this table's rules, so that a task's
        rules win over the defaults. Takes ``Rule`` values and mappings of exception
        class to an ``Outcome`` (``"transient"``, ``"permanent"``, ``"skip"``) or a
        decision value: ``DEFAULT_TABLE.extend({RateLimited: "transient"})``."""
        added: list[Rule] = []
        for item in rules:
            if isinstance(item, Rule):
                added.append(item)
            elif isinstance(item, Mapping):
                added.extend(_mapping_rule(key, value) for key, value in item.items())
            else:
                raise ConfigurationError(f"extend() takes Rules or a mapping, not {item!r}")
        return DecisionTable((*added, *self.rules))

    @property
    def names(self) -> list[str]:
        """The rule names, top to bottom: the order ``decide`` asks them in."""
        return [rule.name for rule in self.rules]


_TRANSPORT = _retry("transport error is transient")

#: The defaults, asked top to bottom; whatever none answers is a bug (dead letter, alert).
DEFAULT_TABLE = DecisionTable(
    (
        # -- our own outcomes, raised on purpose by job bodies
        when(
            TransientError, lambda exc: RetryDecision(str(exc), getattr(exc, "retry_after", None))
        ),
        when(UncertainOutcomeError, lambda exc: RetryDecision(str(exc), reconcile=True)),
        when(PermanentError, lambda exc: DeadLetterDecision(Category.PERMANENT, str(exc))),
        when(SkipJob, lambda exc: SkipDecision(str(exc))),
        when(PayloadError, lambda exc: DeadLetterDecision(Category.PERMANENT, str(exc))),
        # the broker or the store did not answer a publish in time (a child job, a relay)
        when(BackendUnavailable, lambda exc: RetryDecision(str(exc))),
        when(ValidationError, _validation, "pydantic ValidationError"),
        # -- builtin transport errors (socket.timeout is TimeoutError)
        when((TimeoutError, ConnectionError, RemoteDisconnected, IncompleteRead), _TRANSPORT),
        when(_network, _TRANSPORT, "DNS, unreachable network, TLS stream cut"),
        when(_url_transport, _TRANSPORT, "URLError over a transport error"),
        # -- HTTP status errors: 408/425/429/5xx retry, every other 4xx is permanent
        when(lambda exc: http_status(exc) is not None, _http, "HTTP status"),
        # -- transport errors of well-known libraries, by qualified class name
        when(named(*TRANSIENT_NAMES), _TRANSPORT, "library transport errors"),
        when(_invalidated_connection, _TRANSPORT, "sqlalchemy DBAPIError, connection invalidated"),
        when(named("smtplib.SMTPAuthenticationError"), _smtp_auth, "SMTP credentials: 5xx bug"),
        when(named("smtplib.SMTPResponseException"), _smtp, "SMTP reply: 4xx retry, 5xx permanent"),
        when(named("smtplib.SMTPRecipientsRefused"), _smtp_recipients, "SMTP recipients refused"),
        when(named(*SOFT_TIME_LIMIT), _retry("soft time limit hit"), "SoftTimeLimitExceeded"),
    )
)
