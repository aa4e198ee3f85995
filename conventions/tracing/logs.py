"""Log records that tell which story they belong to, in text or JSON.

Every record made while a job runs carries ``correlation_id``, ``request_id``, ``task``,
``version``, ``task_id``, ``idempotency_key`` and ``attempt`` as attributes (a log record
factory reads them from a context variable: any logger, any library, no adapter needed).
Outside a job, in web code under :func:`conventions.bind` or the middleware of
:mod:`conventions.contrib.web`, records carry the bound ``correlation_id`` and ``request_id``.

Two formats: ``text`` (the default, for people: the message, then ``corr=... task=...``)
and ``json`` (one object per line, for log shippers). JSON uses the standard library: a
formatter is thirty lines, and a dependency for it would be one more thing to keep
updated in every worker image.

The worker binds the fields in ``task_prerun`` and clears them in ``task_postrun``, so
Celery's own "succeeded in" line carries them too.

Everything from outside reaches a record escaped (:mod:`conventions.tracing.escaping`): the
story fields, set from a message's headers and payload, are escaped as records get them,
so ``%(correlation_id)s`` in any format shows a forged newline or ANSI escape as ``\\n``
or ``\\x1b``; the text format also escapes the message (one record, one line) and the
exception messages in a traceback. JSON escapes them by itself.

Both formats scrub what a failure writes (``conventions.tracing.scrubbing``, as in dead letters):
every exception text, and the message of every record at warning level or above, with an
exception, or of Celery's retry, ignored and rejected lines. Other info lines are left as
they are: they carry ids, and scrubbing every line would cost every job a few
regular-expression passes for nothing.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final

from celery.app import trace

from conventions.tracing import context
from conventions.tracing.escaping import escape
from conventions.tracing.scrubbing import scrub_text

#: the attributes every record gets (None when unknown)
FIELDS: Final = (
    "correlation_id",
    "request_id",
    "task",
    "version",
    "task_id",
    "idempotency_key",
    "attempt",
)
FORMATS: Final = ("text", "json")

_VERSION = re.compile(r"\.(v[1-9][0-9]*)$")
_job: ContextVar[dict[str, Any] | None] = ContextVar("conventions_log_fields", default=None)
_installed: list[Any] = []


def version_of(task: str | None) -> str | None:
    """``v2`` for ``email.send_receipt.v2``; None for a name without a version."""
    found = _VERSION.search(task or "")
    return found.group(1) if found else None


def bind_job(**fields: Any) -> None:
    """Set the job fields of the records made from now on in this context."""
    _job.set({name: fields.get(name) for name in FIELDS})


def update_job(**fields: Any) -> None:
    """Change some job fields (the idempotency key, once the payload is validated)."""
    current = _job.get()
    if current is not None:
        _job.set({**current, **fields})


def clear_job() -> None:
    _job.set(None)


@contextmanager
def job_fields(**fields: Any) -> Iterator[None]:
    """Bind job fields for a block (a relay publishing one outbox row), then restore."""
    token = _job.set({name: fields.get(name) for name in FIELDS})
    try:
        yield
    finally:
        _job.reset(token)


def current_fields() -> dict[str, Any]:
    """The fields a record made now would carry."""
    job = _job.get()
    if job is not None:
        return dict(job)
    fields = dict.fromkeys(FIELDS)
    trace = context.current()
    if trace is not None:
        fields["correlation_id"] = trace.correlation_id
        fields["request_id"] = trace.request_id
    return fields


def record_fields() -> dict[str, Any]:
    """The fields a record made now gets: :func:`current_fields`, each text escaped
    (headers and payloads are chosen by whoever published the job)."""
    return {
        name: escape(value) if isinstance(value, str) else value
        for name, value in current_fields().items()
    }


def fields_of(record: logging.LogRecord) -> Mapping[str, Any]:
    """The story fields of ``record``: its own (the record factory set them), else those
    of the context it is formatted in (a process that did not call :func:`install`)."""
    return record.__dict__ if "correlation_id" in record.__dict__ else record_fields()


def install() -> None:
    """Wrap the log record factory once per process (idempotent), so that every record
    carries the story fields as attributes (``%(correlation_id)s`` in any format). Never
    at import: a worker or beat of an ``App`` calls it when it starts; a web process that
    formats with its own format strings calls it once at start-up."""
    if _installed:
        return
    base = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        record.__dict__.update(record_fields())
        return record

    _installed.append(base)
    logging.setLogRecordFactory(factory)


#: Celery's info lines that carry an exception's text: a retry ("retry: Retry in 2s: ..."),
#: an ignored or rejected job
EXCEPTION_LINES: Final = frozenset({trace.LOG_RETRY, trace.LOG_IGNORED, trace.LOG_REJECTED})


def _scrubs(record: logging.LogRecord) -> bool:
    """Whether a record's message is scrubbed: a warning or worse, one with an exception,
    or one of Celery's info lines about an exception."""
    return (
        record.levelno >= logging.WARNING
        or bool(record.exc_info)
        or (isinstance(record.msg, str) and record.msg in EXCEPTION_LINES)
    )


def traceback_text(ei: Any) -> str:
    """A traceback as the text format writes it: the frames as Python prints them, each
    exception's message escaped onto its one line (a message is where outside text
    lands: a forged newline there would start a line of its own), then scrubbed."""
    out = []
    for chunk in traceback.TracebackException(*ei).format():
        if chunk[:1].isspace():  # frames, chain notes, an exception group's branches
            out.append(escape(chunk, newlines=False))
        else:  # "Traceback (most recent call last):", or an exception's own lines
            body, end = (chunk[:-1], "\n") if chunk.endswith("\n") else (chunk, "")
            out.append(escape(body) + end)
    return scrub_text("".join(out).rstrip("\n"))


class TextFormatter(logging.Formatter):
    """Celery's usual line, then the story fields that are set: ``corr=... task=...``;
    the message and the fields escaped, so a record is one line (then its traceback)."""

    SHORT: Final = {"correlation_id": "corr", "idempotency_key": "key", "task_id": "id"}

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt or "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s", datefmt)

    def formatException(self, ei: Any) -> str:
        return traceback_text(ei)

    def formatStack(self, stack_info: str) -> str:
        return escape(stack_info, newlines=False)

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        record.message = escape(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message

    def format(self, record: logging.LogRecord) -> str:
        cached, record.exc_text = record.exc_text, None  # never another formatter's text
        try:
            line = super().format(record)
        finally:
            record.exc_text = cached
        if _scrubs(record):
            line = scrub_text(line)
        fields = fields_of(record)
        parts = [
            f"{self.SHORT.get(name, name)}={escape(str(value))}"
            for name in ("correlation_id", "task", "task_id", "attempt", "idempotency_key")
            if (value := fields.get(name)) is not None
        ]
        if not parts:
            return line
        first, sep, rest = line.partition("\n")  # keep a traceback below the fields
        return f"{first} [{' '.join(parts)}]{sep}{rest}"


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, process, message, the story fields
    and, for an exception, its type and traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "message": scrub_text(record.getMessage()) if _scrubs(record) else record.getMessage(),
        }
        fields = fields_of(record)
        for name in FIELDS:
            value = fields.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__qualname__
            out["traceback"] = scrub_text(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


def formatter(kind: str) -> logging.Formatter:
    if kind not in FORMATS:
        raise ValueError(f"log format {kind!r} is unknown: use one of {list(FORMATS)}")
    return JSONFormatter() if kind == "json" else TextFormatter()


def configure(logger: logging.Logger, kind: str) -> None:
    """Give every handler of ``logger`` our formatter (Celery's ``after_setup_logger``)."""
    chosen = formatter(kind)
    for handler in logger.handlers:
        handler.setFormatter(chosen)
