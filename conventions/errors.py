"""Every error the layer raises or understands, in one rooted tree.

Two branches, kept apart on purpose: a ``JobOutcome`` is control flow a job body raises
on purpose to say how the job ends (``conventions.jobs.decisions`` maps each one to a
decision), while a ``LayerError`` is a fault in how the layer is used (a wrong task
definition, a bad payload, a refused publish). Catching ``ConventionsError`` catches
both; catching ``JobOutcome`` never swallows a configuration fault.

The tree (``tree()`` renders the live hierarchy in this format, and a test compares)::

    ConventionsError
    +-- JobOutcome
    |   +-- TransientError
    |   |   `-- LockBusy
    |   +-- PermanentError
    |   +-- UncertainOutcomeError
    |   +-- SkipJob
    |   `-- ResumeLater
    `-- LayerError
        +-- ConfigurationError
        |   `-- MissingExtra
        +-- PayloadError
        |   `-- KeyConflict
        +-- QueueOverCapacity
        +-- KeyHeld
        +-- BackendUnavailable
        +-- Unroutable
        `-- NewerFormat

The first line of each class's docstring is its default message (``raise SkipJob()``
reads well in logs without a message). Every constructor takes the message first and
everything else by keyword, so the exceptions pickle and survive Celery's exception
serialization (which rebuilds them as ``cls(*args)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


def _default_message(cls: type[BaseException]) -> str:
    """The first line of the nearest docstring in ``cls``'s MRO (docstrings don't inherit)."""
    for klass in cls.__mro__:
        doc = klass.__dict__.get("__doc__")
        if isinstance(doc, str) and doc.strip():
            return doc.strip().splitlines()[0].strip()
    return cls.__name__


class ConventionsError(Exception):
    """A celery-conventions error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message if message is not None else _default_message(type(self)))

    @property
    def message(self) -> str:
        """The message the exception was raised with (or its default)."""
        return str(self.args[0]) if self.args else _default_message(type(self))


# -- outcomes: raised by a job body on purpose -------------------------------------------


class JobOutcome(ConventionsError):
    """The job body ended the job on purpose."""


class TransientError(JobOutcome):
    """A transient failure: the job will be retried with backoff.

    ``retry_after`` (seconds, e.g. parsed from a ``Retry-After`` header) asks for at
    least that long before the next attempt; the backoff still applies when it is longer
    and the broker's safe maximum still clamps it. A negative value counts as 0 and a NaN
    as "not given", so that raising the outcome can never itself fail.
    """

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after: float | None = _seconds(retry_after)


class LockBusy(TransientError):
    """A lock is held by someone else: the job is retried with backoff.

    Raised by ``conventions.capacity.locks.mutex`` when the lease stays taken; ``name`` is the
    lock and ``holder`` the owner that holds it.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        name: str = "",
        holder: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.name: str = name
        self.holder: str | None = holder
        if message is None and name:
            message = f"lock {name!r} is held by {holder or 'someone else'}"
        super().__init__(message, retry_after=retry_after)


class PermanentError(JobOutcome):
    """A permanent failure: retrying cannot help, the job is dead-lettered."""


class UncertainOutcomeError(JobOutcome):
    """The side effect may have happened: the job is retried, reconciling first.

    Raise it when a call timed out after the request left (a charge, an email): the next
    attempt runs the task's reconcile step to find out what happened before acting again.
    """


class SkipJob(JobOutcome):
    """The job was skipped: there is nothing to do.

    A skip is not a failure: nothing is retried, dead-lettered or alerted.
    """


class ResumeLater(JobOutcome):
    """Stop now, continue later: the job is published again and no attempt is spent.

    Raise it when ``ctx.is_stopping()`` turns true (a deploy), after saving a checkpoint:
    the next delivery continues from that checkpoint, on this worker or another.
    """


# -- faults: the layer was used wrongly --------------------------------------------------


class LayerError(ConventionsError):
    """The convention layer was used wrongly."""


class ConfigurationError(LayerError):
    """A task definition or setting is wrong.

    Raised at import or startup time wherever possible; the message says the fix.
    """


class MissingExtra(ConfigurationError, ImportError):
    """A feature needs an optional dependency that is not installed.

    The message names the extra to install: ``pip install 'celery-conventions[sql]'``.
    ``extra`` is its name. It is an ``ImportError`` too, so code that guards an optional
    import with ``except ImportError`` keeps working.
    """

    def __init__(self, message: str | None = None, *, extra: str = "") -> None:
        self.extra: str = extra
        super().__init__(message)


class PayloadError(LayerError, ValueError):
    """The payload failed validation.

    ``errors`` holds pydantic-style error dicts (``loc``, ``msg``, ``type``); without an
    explicit message, ``str()`` names every bad field. It is also a ``ValueError`` so that
    code written against plain validation keeps working.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        errors: Sequence[Mapping[str, Any]] = (),
        task: str | None = None,
    ) -> None:
        self.errors: list[dict[str, Any]] = [dict(error) for error in errors]
        self.task: str | None = task
        if message is None and (self.errors or task):
            message = _describe_payload(_default_message(type(self)), self.errors, task)
        super().__init__(message)

    @property
    def fields(self) -> list[str]:
        """The dotted location of every bad field, in error order."""
        return [_loc(error.get("loc")) for error in self.errors]

    @classmethod
    def from_validation_error(
        cls, exc: ValidationError, *, task: str | None = None
    ) -> PayloadError:
        """Wrap a pydantic ``ValidationError``, dropping the input values (they may hold
        personal data and end up in logs and dead letters)."""
        errors = [
            {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False, include_context=False)
        ]
        return cls(errors=errors, task=task)


class KeyConflict(PayloadError):
    """Another payload holds this idempotency key: the publish was refused.

    A job with the same key and a different payload is pending (or, in the worker, the
    key is done): nothing was published, and the first job is not taken for this one.
    ``key`` names the key.
    """

    def __init__(
        self, message: str | None = None, *, key: str = "", task: str | None = None
    ) -> None:
        self.key: str = key
        if message is None and key:
            message = (
                f"{_default_message(type(self)).rstrip('.')}: {key!r} is held by a job of "
                "another payload"
            )
        super().__init__(message, task=task)


class QueueOverCapacity(LayerError):
    """The queue is over capacity: the publish was refused.

    Backpressure (``conventions_backpressure``) refuses a publish rather than let a
    queue grow without bound; nothing was published. ``queue`` names the queue.
    """

    def __init__(self, message: str | None = None, *, queue: str = "") -> None:
        self.queue: str = queue
        if message is None and queue:
            message = f"{_default_message(type(self)).rstrip('.')} (queue {queue!r})"
        super().__init__(message)


class KeyHeld(LayerError):
    """A batch member's idempotency key is held by a job outside the batch: refused.

    ``Batch.submit()`` refuses the whole batch (nothing is published) when a member's key
    is reserved by a job that is not done yet and is not that member: the member would
    send nothing and its batch would never end. ``key`` names the key, ``holder`` the job
    that holds it.
    """

    def __init__(self, message: str | None = None, *, key: str = "", holder: str = "") -> None:
        self.key: str = key
        self.holder: str = holder
        if message is None and key:
            message = f"{_default_message(type(self)).rstrip('.')}: {key!r} (job {holder})"
        super().__init__(message)


class BackendUnavailable(LayerError):
    """The broker or the store did not answer in time: nothing was published.

    Raised by ``.delay()``/``apply_async`` (and the CLI) within the bounded time the
    profile sets, instead of hanging or retrying without end. ``backend`` says which one
    (``broker`` or ``store``). A web handler catches this one type and answers 503, or
    writes the job to the outbox instead (``docs/howto/outbox.md``).
    """

    def __init__(self, message: str | None = None, *, backend: str = "") -> None:
        self.backend: str = backend
        super().__init__(message)


class Unroutable(LayerError):
    """The broker routed the message to no queue: nothing was published.

    On RabbitMQ the layer publishes with ``mandatory`` and publisher confirms, so a
    message that no queue is bound to take (a queue deleted, an exchange without the
    binding, an exchange that does not exist) comes back to ``.delay()`` as this error
    instead of being dropped by the broker. Not a broker outage (``BackendUnavailable``):
    trying again will not help until the queue is declared (start a worker for it, or
    declare ``task_queues``). ``exchange`` and ``routing_key`` say where it was sent.
    """

    def __init__(
        self, message: str | None = None, *, exchange: str = "", routing_key: str = ""
    ) -> None:
        self.exchange: str = exchange
        self.routing_key: str = routing_key
        super().__init__(message)


class NewerFormat(LayerError):
    """Met a message or record written by a newer release of the layer: not read.

    Each wire and storage format has a version (``conventions.config.formats``); a reader
    refuses a newer one rather than misread it. ``name`` names it, ``found`` is the
    version met and ``reads`` the newest this release reads. The message says what to do:
    upgrade this process (or replay once the fleet runs the new release).
    """

    def __init__(
        self, message: str | None = None, *, name: str = "", found: int = 0, reads: int = 0
    ) -> None:
        self.name: str = name
        self.found: int = found
        self.reads: int = reads
        super().__init__(message)


# -- helpers -----------------------------------------------------------------------------


def _seconds(value: float | None) -> float | None:
    if value is None or math.isnan(value):
        return None
    return max(0.0, float(value))


def _loc(loc: Any) -> str:
    if isinstance(loc, str):
        return loc or "(payload)"
    if isinstance(loc, Sequence):
        return ".".join(str(part) for part in loc) or "(payload)"
    return "(payload)" if loc is None else str(loc)


def _describe_payload(base: str, errors: list[dict[str, Any]], task: str | None) -> str:
    where = f" for {task}" if task else ""
    if not errors:
        return f"{base.rstrip('.')}{where}"
    parts = [
        f"{_loc(e.get('loc'))}: {e.get('msg', 'invalid')} [{e.get('type', '?')}]" for e in errors
    ]
    return f"{base.rstrip('.')}{where}: " + "; ".join(parts)


def _children(cls: type[ConventionsError]) -> list[type[ConventionsError]]:
    # Only this module's classes: an application's own subclasses are not the layer's tree.
    return [sub for sub in cls.__subclasses__() if sub.__module__ == __name__]


def tree() -> str:
    """Render the live class hierarchy from ``ConventionsError`` down, in definition order,
    in the format the module docstring draws (so the drawing can never go stale)."""
    lines = [ConventionsError.__name__]

    def walk(cls: type[ConventionsError], prefix: str) -> None:
        children = _children(cls)
        for index, child in enumerate(children):
            last = index == len(children) - 1
            lines.append(f"{prefix}{'`-- ' if last else '+-- '}{child.__name__}")
            walk(child, prefix + ("    " if last else "|   "))

    walk(ConventionsError, "")
    return "\n".join(lines)


__all__ = [
    "ConfigurationError",
    "ConventionsError",
    "JobOutcome",
    "KeyConflict",
    "LayerError",
    "LockBusy",
    "PayloadError",
    "PermanentError",
    "QueueOverCapacity",
    "ResumeLater",
    "SkipJob",
    "TransientError",
    "UncertainOutcomeError",
    "Unroutable",
    "tree",
]
