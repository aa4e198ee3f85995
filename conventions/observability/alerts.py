"""Alerts: an error log line and, when Sentry is on, exactly one Sentry event.

``alert`` is how the layer reports a dead letter that needs a person (``bug``,
``exhausted``, ``poison``). It logs at error level and, when ``sentry_sdk`` has an active
client, captures one event tagged with the job (``task``, ``version``, ``queue``,
``idempotency_key``, ``correlation_id``, ``category``). It never raises: a broken Sentry
must not break a job.

One event, ours. Sentry's Celery integration would also report the exception a dead
letter re-raises (it skips only ``Retry``/``Ignore``/``Reject`` and a task's ``throws``),
the logging integration would report our error line, and a poison pill ends in a
``Reject`` that nobody reports. So the layer reports, with its tags and for every
category alike, and a global event processor (installed by ``init_sentry``, or on first
use when the application initialised Sentry itself: see ``active_sentry``) drops the
duplicates: an event about an exception the layer already handled (marked by
``mark_handled``), and the error lines of ``conventions.worker.delivery`` and
``conventions.observability.alerts`` (they stay breadcrumbs). A retry raises Celery's ``Retry``,
which the integration never reports, and logs a warning: a breadcrumb, never an event.

No personal data. Every event is scrubbed with ``conventions.tracing.scrubbing.scrub_event``
(exception values, messages, breadcrumbs, extra, tags): by the global event processor,
which also covers a ``sentry_sdk.init`` of the application's own, and by the
``before_send`` that ``init_sentry`` installs, which runs after the SDK has turned frame
locals into text. ``init_sentry`` sends no frame locals unless asked
(``include_local_variables=True``; they are scrubbed then too). The error line ``alert``
logs carries a scrubbed copy of the exception.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from conventions.config import extras
from conventions.tracing import scrubbing

logger = logging.getLogger("conventions.observability.alerts")

#: the loggers whose lines are breadcrumbs only: their error lines are dead letters that
#: were alerted through ``alert`` already, or decided not to be alerts
QUIET_LOGGERS = frozenset({"conventions.observability.alerts", "conventions.worker.delivery"})
#: set on an exception the layer has reported, or decided not to report
_HANDLED = "_cc_alert_handled"
_VERSION = re.compile(r"\.(v[1-9][0-9]*)$")


def alert(message: str, *, exc: BaseException | None, tags: Mapping[str, str]) -> None:
    """Log ``message`` at error level (with ``exc``'s traceback) and send one Sentry
    event (``exc``, else ``message``) with ``tags``; ``version`` is derived from
    ``tags["task"]``. Never raises."""
    try:
        if active_sentry() is not None:
            _capture(message, exc, with_version(tags))
    except Exception:
        logger.warning("could not send an alert to Sentry", exc_info=True)
    mark_handled(exc)
    # logged after the capture: Sentry's dedupe keeps the first event about an exception
    logger.error("%s", message, exc_info=scrubbing.scrubbed(exc) if exc is not None else None)


def active_sentry() -> ModuleType | None:
    """``sentry_sdk`` when a Sentry client is active in this process, else None.

    It never imports ``sentry_sdk`` (the ``sentry`` extra): no client can be active unless
    something imported it. The first time it finds a client (the application's own
    ``sentry_sdk.init`` as well as ``init_sentry``'s), it installs the layer's global
    event processor, which drops the duplicates and scrubs every event.
    """
    sdk = extras.loaded("sentry_sdk")
    if sdk is None or not sdk.get_client().is_active():
        return None
    _install_processor()
    return sdk


@functools.cache
def _install_processor() -> None:
    """Install the global event processor, once per process."""
    from sentry_sdk.scope import add_global_event_processor

    add_global_event_processor(_drop_duplicates)


def _capture(message: str, exc: BaseException | None, tags: Mapping[str, str]) -> None:
    import sentry_sdk

    with sentry_sdk.new_scope() as scope:
        for name, value in tags.items():
            scope.set_tag(name, value)
        scope.set_context("alert", {"message": message})
        if exc is not None:
            sentry_sdk.capture_exception(exc)
        else:  # a poison pill: group by what happened, not by the unique message
            scope.fingerprint = ["conventions", tags.get("category", ""), tags.get("task", "")]
            sentry_sdk.capture_message(message, level="error")


def with_version(tags: Mapping[str, str]) -> dict[str, str]:
    """``tags`` plus ``version``, the ``vN`` suffix of ``tags["task"]``, when it has one."""
    out = dict(tags)
    found = _VERSION.search(out.get("task", ""))
    if found and "version" not in out:
        out["version"] = found.group(1)
    return out


def mark_handled(exc: BaseException | None) -> None:
    """The layer has reported ``exc`` (or decided it is no alert): Sentry drops any other
    event about it, such as the Celery integration's when the task re-raises it."""
    if exc is not None:
        with contextlib.suppress(Exception):
            setattr(exc, _HANDLED, True)


def is_handled(exc: BaseException | None) -> bool:
    return getattr(exc, _HANDLED, False) is True


def _drop_duplicates(event: Any, hint: Any) -> Any:
    """The global event processor: drops what ``alert`` reported already, and scrubs the
    rest."""
    hint = hint or {}
    record = hint.get("log_record")
    if record is not None and getattr(record, "name", None) in QUIET_LOGGERS:
        return None
    exc_info = hint.get("exc_info")
    if exc_info and is_handled(exc_info[1]):
        return None
    return scrubbing.scrub_event(event)


def init_sentry(dsn: str | None, **options: Any) -> bool:
    """Initialise Sentry with the Celery integration when ``dsn`` is set; True when it did.

    One helper for web, worker and beat (the worker and beat call it from their init
    signals with ``sentry_dsn``). ``options`` go to ``sentry_sdk.init``; a
    ``CeleryIntegration`` passed in ``integrations`` replaces the default one.

    Frame locals are off unless ``include_local_variables=True`` is passed (they hold
    payloads, addresses, tokens). Every event is scrubbed before it is sent, then handed
    to the ``before_send`` passed in, if any.

    It needs the ``sentry`` extra: with a ``dsn`` and without sentry-sdk, it raises
    ``MissingExtra`` naming the extra.
    """
    if not dsn:
        return False
    extras.require("sentry_sdk", "sentry", "Sentry reporting")
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration

    _install_processor()
    options.setdefault("include_local_variables", False)
    options["before_send"] = _scrubbing_before(options.get("before_send"))
    integrations = list(options.pop("integrations", ()))
    if not any(isinstance(item, CeleryIntegration) for item in integrations):
        # Sentry Crons for beat's crontab and whole-minute entries (docs/howto/schedules.md)
        integrations.append(CeleryIntegration(monitor_beat_tasks=True))
    sentry_sdk.init(dsn=dsn, integrations=integrations, **options)
    return True


def _scrubbing_before(then: Callable[[Any, Any], Any] | None) -> Callable[[Any, Any], Any]:
    """A ``before_send`` that scrubs the (serialised) event, then calls ``then``."""

    def before_send(event: Any, hint: Any) -> Any:
        event = scrubbing.scrub_event(event)
        return then(event, hint) if then is not None else event

    return before_send
