"""One scrubber for every exception text that leaves the process.

Exception messages hold what the code had at hand: ``smtplib.SMTPRecipientsRefused``
carries the refused address as a dict key, a driver error quotes the row, a URL error the
password. The dead letter always kept them scrubbed; the same text also reaches the
worker's log, Celery's result backend (Flower's Exception and Traceback fields), Celery's
``task-failed`` event and Sentry. This module scrubs them all the same way:

* ``scrub_text`` replaces e-mail addresses, card-like digit runs, ``password=...``-style
  values and URL credentials (the dead-letter record uses it too);
* ``scrubbed`` gives the exception Celery should see: the exception itself when nothing
  in it or its chain needs scrubbing, else a copy built from scrubbed arguments (same
  type when that rebuilds faithfully, else a ``ScrubbedError`` naming the original type),
  with the original traceback and a scrubbed copy of its cause;
* ``scrub_event`` scrubs every string of a Sentry event (exception values, messages,
  breadcrumbs, extra, frame locals when they are sent).

The original exception stays in the worker's memory only: the decision is taken on it,
and the dead letter keeps its (scrubbed) traceback.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

#: what looks like personal data or a secret, what replaces it, and a substring without
#: which the pattern cannot match (a cheap test first: most text holds no ``@``)
SCRUBBERS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+\.[\w.-]+"), "<email>", "@"),
    # 13 to 19 digits (a card, an account number), optionally grouped by single spaces or
    # dashes; not inside a longer token, so that a UUID's digit groups are left alone
    (re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])"), "<number>", ""),
    (
        re.compile(
            r"(?i)\b(password|passwd|secret|token|api[_-]?key|authorization)\b(\s*[=:]\s*)\S+"
        ),
        r"\1\2<redacted>",
        "",
    ),
    (re.compile(r"(?i)(://[^:/\s]*:)[^@/\s]+@"), r"\1<redacted>@", "://"),  # user optional
)
#: attributes the layer sets on an exception (``alerts``' "already reported" mark): a
#: scrubbed copy carries them, so that Sentry still drops the duplicate event
LAYER_MARKS = ("_cc_alert_handled",)
#: how deep a cause chain is copied; the rest is cut (a chain is rarely longer than 3)
MAX_CHAIN = 8


def scrub_text(text: str) -> str:
    """``text`` with what looks like personal data or secrets replaced."""
    for pattern, replacement, needed in SCRUBBERS:
        if needed in text:
            text = pattern.sub(replacement, text)
    return text


def is_clean(text: str) -> bool:
    return scrub_text(text) == text


class ScrubbedError(Exception):
    """An exception whose text was scrubbed and whose type could not be rebuilt.

    A stand-in raised to Celery (and so shown by Flower and sent to Sentry) in place of
    an exception that needed scrubbing but whose class cannot be rebuilt from scrubbed
    arguments. ``original`` is the qualified name of that class. Not part of the
    ``ConventionsError`` tree: it is no outcome and no fault of the layer, only a
    scrubbed rendering of someone else's exception.
    """

    def __init__(self, original: str, message: str) -> None:
        super().__init__(original, message)
        self.original = original
        self.message = message

    def __str__(self) -> str:
        return f"{self.original}: {self.message}" if self.message else self.original


def scrubbed(exc: BaseException) -> BaseException:
    """The exception to let leave the process in place of ``exc``.

    ``exc`` itself when its text and its chain's are clean (the common case costs a few
    regular-expression passes and changes nothing). Otherwise a copy: ``exc``'s
    traceback, a scrubbed copy of its cause (or of its context, shown as the cause), and
    ``__suppress_context__`` set, so that raising the copy inside an ``except`` block
    never prints the raw original as its context.
    """
    if _chain_is_clean(exc):
        return exc
    return _copy(exc, MAX_CHAIN)


def _chain_is_clean(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts = [_text(str, current), _text(repr, current), *_notes(current)]
        if not all(is_clean(text) for text in texts):
            return False
        current = _next_in_chain(current)
    return True


def _next_in_chain(exc: BaseException) -> BaseException | None:
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def _copy(exc: BaseException, depth: int) -> BaseException:
    copy = _rebuilt(exc)
    if copy is None:
        name = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
        copy = ScrubbedError(name, scrub_text(_text(str, exc)))
    copy.__traceback__ = exc.__traceback__
    cause = _next_in_chain(exc)
    copy.__cause__ = _copy(cause, depth - 1) if cause is not None and depth > 1 else None
    copy.__suppress_context__ = True
    for note in _notes(exc):  # PEP 678 notes, printed under the traceback
        copy.add_note(scrub_text(note))
    for mark in LAYER_MARKS:
        if mark in getattr(exc, "__dict__", {}):
            with contextlib.suppress(Exception):
                setattr(copy, mark, exc.__dict__[mark])
    return copy


def _rebuilt(exc: BaseException) -> BaseException | None:
    """``type(exc)(*scrubbed args)`` when that gives the same type, with exactly those
    args, and clean text; None when the class cannot be rebuilt that way (a constructor
    with other arguments, args that are not plain data, a ``__str__`` that reads other
    attributes)."""
    try:
        args = tuple(_scrub_value(arg) for arg in exc.args)
        copy = type(exc)(*args)
        same = type(copy) is type(exc) and copy.args == args
        if same and is_clean(str(copy)) and is_clean(repr(copy)):
            return copy
    except Exception:
        return None
    return None


class _NotPlainData(Exception):
    pass


def _scrub_value(value: Any) -> Any:
    """``value`` with every string scrubbed, for plain data only (str, bytes, numbers,
    None, and tuples, lists, dicts of those); anything else raises ``_NotPlainData``."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, bytes):
        text = value.decode("utf-8", "surrogateescape")
        clean = scrub_text(text)
        return value if clean == text else clean.encode("utf-8", "surrogateescape")
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, tuple | list):
        return type(value)(_scrub_value(item) for item in value)
    if isinstance(value, dict):
        return {_scrub_value(key): _scrub_value(item) for key, item in value.items()}
    raise _NotPlainData(type(value).__qualname__)


def _notes(exc: BaseException) -> list[str]:
    notes = getattr(exc, "__notes__", None)
    return [str(note) for note in notes] if isinstance(notes, list) else []


def _text(render: Callable[[BaseException], str], exc: BaseException) -> str:
    try:
        return render(exc)
    except Exception:  # a broken __str__ must not break a failure path
        return f"<{type(exc).__qualname__}: unprintable>"


def scrub_event(event: Any) -> Any:
    """A Sentry event with every string in it scrubbed (keys of dicts included)."""
    if isinstance(event, str):
        return scrub_text(event)
    if isinstance(event, dict):
        return {scrub_event(key): scrub_event(value) for key, value in event.items()}
    if isinstance(event, list | tuple):
        return type(event)(scrub_event(item) for item in event)
    return event
