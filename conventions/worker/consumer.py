"""The worker's consumer: a message that cannot become a job is kept, not just logged.

Celery's consumer acks (or, on Redis, rejects, which deletes) a message it cannot turn
into a task, and only logs it: a body that is not valid JSON (``on_decode_error``), a
message that is not a Celery task (``on_unknown_message``), a task nobody registered
(``on_unknown_task``), content it refuses such as pickle (``on_invalid_task``). A body
with the task headers but the wrong shape (not ``[args, kwargs, embed]``) is worse: it
raises inside the consumer, the worker stops with "Unrecoverable error", and the message,
still unacknowledged, goes back to the queue to stop the next worker too.

:class:`Consumer` writes a dead-letter record first (the raw body kept, scrubbed and
size-capped, for inspection), then lets Celery ack or reject as before; the shape error
is caught, recorded and acked, so the worker keeps serving. Categories: ``unparseable``
when the message cannot be read as a job at all, ``invalid`` when it can but names an
unknown task or a refused content type. Set by ``worker_consumer`` in ``celeryconfig.py``.

Before Celery sees a message, :meth:`Consumer.refusal` turns away, as dead letters:

* a message written by a newer release than this worker reads (its ``cc_format`` header,
  :mod:`conventions.config.formats`): ``newer_format``, checked before anything else
  reads the message; the record keeps its kwargs, its reservation is given back, and it
  replays once the fleet runs the new release. A message without the header (an older
  release's, a foreign producer's) is read as always;
* an entry the transport wrapped because it was not a well-formed kombu envelope
  (:mod:`conventions.transport.envelope`): ``unparseable``, with the transport's reason;
* a message larger than ``conventions_max_message_bytes`` (1 MiB by default; payloads
  hold ids) or with more than ``envelope.MAX_HEADERS`` headers: ``invalid``, so that a
  20 MB body is neither shipped to a pool child nor kept whole, and its FAILURE result
  stays small. On the layer's Redis transport the entry is weighed as read from the
  broker, before it is decoded (the transport wraps it; :meth:`connection_for_read`
  gives it the cap); elsewhere (RabbitMQ) the body as received plus every header and
  property, before Celery decodes the body;
* a message whose ETA is further away than the transport's visibility timeout:
  ``invalid``. The worker would hold it unacked until due, and the transport would
  deliver it again every visibility timeout meanwhile, each copy held too. Until
  delayed delivery lives in the broker, refusing it (replayable from the dead letters)
  is the only safe answer; the layer's own countdowns are capped below the timeout.

Each refusal also stores a small FAILURE result for a known task, so that a caller
waiting on ``.get()`` gets an answer.
"""

from __future__ import annotations

import logging
import socket
import traceback as tb
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from celery.exceptions import Reject
from celery.utils.time import maybe_iso8601, maybe_make_aware
from celery.worker.consumer import Consumer as CeleryConsumer

from conventions.batches import callbacks as batch_callbacks
from conventions.config import formats
from conventions.observability import audit
from conventions.observability.deadletters import (
    MAX_MESSAGE,
    MAX_RAW_BODY,
    MAX_TRACEBACK,
    capped_headers,
    capped_payload,
    kept_body,
    scrub,
)
from conventions.store import keys
from conventions.store.records import Category, DeadLetter, utcnow
from conventions.tracing import headers as hdr
from conventions.transport import envelope
from conventions.worker import batch_ends, event_batch

logger = logging.getLogger("conventions.worker.consumer")

__all__ = ["MAX_RAW_BODY", "Consumer", "raw_body", "record"]

#: the largest message a worker takes (bytes of body plus header values) unless
#: ``conventions_max_message_bytes`` says otherwise: payloads hold ids, a few KB at most
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
#: the ``exc_type`` of a message written by a newer release than this worker reads
NEWER_FORMAT = "NewerFormat"
#: the refusals whose record keeps the job's kwargs, so that it replays
REPLAYABLE = ("EtaBeyondVisibility", NEWER_FORMAT)


def raw_body(message: Any) -> dict[str, Any]:
    """What a record keeps of the body as it arrived (``deadletter.kept_body``: size,
    sha256 and a head of ``MAX_RAW_BODY`` bytes, text when UTF-8, scrubbed, else
    base64), with its content type and encoding. For an entry the transport wrapped,
    the size and digest are those of the whole entry it saw."""
    body = message.body
    data = body if isinstance(body, bytes) else str(body).encode("utf-8", "replace")
    facts = envelope.wrapped_facts(message) or {}
    size, digest = facts.get("size"), facts.get("sha256")
    return {
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        **kept_body(
            data,
            size=size if isinstance(size, int) and size >= len(data) else None,
            sha256=digest if isinstance(digest, str) and len(digest) == 64 else None,
        ),
    }


def message_size(message: Any, headers: dict[str, Any]) -> int:
    """About how many bytes a message holds: its body, its headers and its properties
    (names and values: a 10 MB header name or ``reply_to`` counts)."""
    body = message.body
    size = len(body) if isinstance(body, bytes | str) else 0
    properties = message.properties if isinstance(message.properties, dict) else {}
    for fields in (headers, properties):
        for name, value in fields.items():
            size += len(str(name))
            if isinstance(value, str | bytes):
                size += len(value)
            elif isinstance(value, list | dict | tuple):
                size += len(repr(value))
    return size


def eta_delay(app: Any, message: Any, headers: dict[str, Any]) -> float | None:
    """Seconds until the message's ETA, read as Celery's worker reads it (a naive moment
    in the app's timezone); None without one, or with one Celery refuses itself."""
    if "task" in headers:
        eta = headers.get("eta")
    else:  # protocol 1: in the body (Celery decodes it next, cached)
        try:
            payload = message.decode()
        except Exception:
            return None
        eta = payload.get("eta") if isinstance(payload, dict) else None
    if not eta:
        return None
    try:
        moment = maybe_make_aware(maybe_iso8601(eta), app.timezone)
    except (AttributeError, ValueError, TypeError, OverflowError):
        return None
    return float((moment - datetime.now(UTC)).total_seconds())


def job_kwargs(message: Any) -> dict[str, Any] | None:
    """The kwargs of a well-formed protocol 2 job with no positional arguments (capped),
    so that its record replays; None for anything else (the raw body is kept then)."""
    try:
        body = message.decode()
    except Exception:
        return None
    if isinstance(body, list | tuple) and len(body) == 3 and not body[0]:
        return capped_payload(body[1]) if isinstance(body[1], dict) else None
    return None


def record(
    consumer: Any,
    message: Any,
    category: Category,
    reason: str,
    exc: BaseException | None,
    *,
    exc_type: str = "UnknownMessage",
    payload: dict[str, Any] | None = None,
) -> DeadLetter | None:
    """Write the dead letter of a message the consumer cannot run; None when the app has
    no store or the store cannot be reached (the message is then only logged, as Celery
    does: it is never requeued, so a bad message cannot spin a worker)."""
    store = getattr(consumer.app, "store", None)
    headers = message.headers if isinstance(message.headers, dict) else {}
    trace = "".join(tb.format_exception(exc)) if exc is not None else ""
    now = utcnow()
    delivery = message.delivery_info or {}
    task_name = str(headers.get("task") or "")[:200]
    member = batch_ends.member_of(headers, task_name)  # a batch member ends with it
    record_id = member.record_id() if member else uuid.uuid4().hex
    # a message with no correlation id of ours gets one here, as at any other receipt
    correlation = hdr.read_header(hdr.CORRELATION, headers.get(hdr.CORRELATION))
    correlation = str(correlation or record_id)  # junk is left out (``hdr.read_header``)
    dead = DeadLetter(
        id=record_id,
        task=task_name,
        task_id=str(headers.get("id") or "")[:200],
        category=category,
        payload=raw_body(message) if payload is None else payload,
        headers=capped_headers(headers),
        idempotency_key=hdr.read_header(hdr.IDEMPOTENCY_KEY, headers.get(hdr.IDEMPOTENCY_KEY)),
        exc_type=type(exc).__qualname__ if exc is not None else exc_type,
        message=scrub(reason, MAX_MESSAGE),
        traceback=scrub(trace, MAX_TRACEBACK),
        attempts=1,
        first_failed_at=now,
        last_failed_at=now,
        worker=str(getattr(consumer, "hostname", None) or socket.gethostname()),
        queue=delivery.get("routing_key"),
        correlation_id=correlation,
    )
    fired: list[str] = []
    try:
        if store is None:
            raise LookupError("the app has no conventions store")
        if member is None:
            store.put_dead_letter(dead)
        else:  # in the same step as its record (``batch_ends``): else its batch never ends
            fired = store.put_dead_letter(dead, batch=member.failed(dead.task_id, dead.id))
    except Exception:
        logger.exception("could not keep a message the worker cannot run (%s)", reason)
        return None
    batch_callbacks.publish_due(consumer.app, fired)  # the member was its batch's last
    # the audit event moves the dead-letter counter of the metrics, as for a job's
    traced = {**hdr.read_headers(headers)[0], hdr.CORRELATION: correlation}
    audit.record(
        store, "dead_lettered", dead.task, dead.task_id, traced,
        detail={"category": str(category), "dead_letter_id": dead.id, "reason": dead.message},
    )  # fmt: skip
    logger.error(
        "message %s dead-lettered as %s (%s): %s", dead.task_id or "-", category, dead.id, reason
    )
    return dead


def give_back_key(task: Any, task_id: str, headers: dict[str, Any]) -> None:
    """Drop the enqueue reservation the message's producer made for it, read from its
    idempotency key header (an older worker does not derive keys from a newer payload):
    only while ``task_id`` holds it, so a header can free no other job's key."""
    carried = hdr.read_header(hdr.IDEMPOTENCY_KEY, headers.get(hdr.IDEMPOTENCY_KEY))
    store = getattr(task, "store", None)
    if not carried or store is None or getattr(task, "dedup", None) is None:
        return
    key = keys.namespaced(task.name, carried)
    try:  # a batch member's reservation is in its batch's partition on a cluster
        with keys.batch_home(key, next(reversed(batch_ends.chain_of(headers)), None)):
            store.unreserve(key, task_id)
    except Exception:
        logger.warning("could not give back the key of refused job %s", task_id, exc_info=True)


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, with a dead letter for every message it cannot run, and its
    task events sent in batches (:mod:`conventions.worker.event_batch`)."""

    _batcher: event_batch.Batcher | None = None

    def _event_batcher(self) -> event_batch.Batcher | None:
        """The batcher of this consumer's task events; None with a window of 0."""
        if self._batcher is None:
            seconds = event_batch.flush_seconds(self.app.conf)
            if not seconds:
                return None
            self._batcher = event_batch.Batcher(seconds)
        return self._batcher

    def on_send_event_buffered(self) -> None:
        """A task event was buffered: flushed at the end of the window, not at once."""
        batcher = self._event_batcher()
        if batcher is None or not self.hub:
            super().on_send_event_buffered()
            return
        batcher.buffered(self.hub, self._flush_events)

    def _flush_buffered_events(self) -> None:
        if self._batcher is not None:
            self._batcher.flush_now(self._flush_events)

    def on_close(self) -> None:
        self._flush_buffered_events()
        super().on_close()

    def stop(self) -> None:
        self._flush_buffered_events()
        super().stop()

    def shutdown(self) -> None:
        self._flush_buffered_events()
        super().shutdown()

    def on_decode_error(self, message: Any, exc: BaseException) -> None:
        record(self, message, Category.UNPARSEABLE, f"cannot decode the body: {exc!r}", exc)
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        reason = "not a Celery task message (no task name in its headers or body)"
        record(self, message, Category.UNPARSEABLE, reason, None)
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: BaseException) -> None:
        name = message.headers.get("task") if isinstance(message.headers, dict) else None
        reason = f"unknown task {name!r}: no such task is registered in this worker"
        record(self, message, Category.INVALID, reason, exc)
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: BaseException) -> None:
        record(self, message, Category.INVALID, f"refused task message: {exc}", exc)
        super().on_invalid_task(body, message, exc)

    def refusal(self, message: Any, max_bytes: int) -> tuple[Category, str, str] | None:
        """Why the message is turned away before Celery sees it (category, reason, the
        record's ``exc_type``), or None for a message Celery may take."""
        facts = envelope.wrapped_facts(message)
        if facts is not None:
            reason = str(facts.get("reason") or "not a kombu message")
            if facts.get("too_large") is True:  # weighed by the transport, not decoded
                return Category.INVALID, reason, "MessageTooLarge"
            return Category.UNPARSEABLE, reason, "MalformedEnvelope"
        headers = message.headers if isinstance(message.headers, dict) else {}
        newer = formats.message_refusal(headers)  # before anything else reads it
        if newer is not None:
            return Category.NEWER_FORMAT, newer, NEWER_FORMAT
        if len(headers) > envelope.MAX_HEADERS:
            return Category.INVALID, envelope.too_many(len(headers)), "MessageTooLarge"
        size = message_size(message, headers)
        if size > max_bytes:
            return (
                Category.INVALID,
                envelope.too_large(f"{size} bytes", max_bytes),
                ("MessageTooLarge"),
            )
        timeout = getattr(getattr(message, "channel", None), "visibility_timeout", None)
        if isinstance(timeout, int | float) and timeout > 0:
            delay = eta_delay(self.app, message, headers)
            if delay is not None and delay > timeout:
                reason = (
                    f"eta beyond the visibility timeout ({timeout:.0f}s): would be delivered "
                    f"repeatedly while the worker holds it (due in {delay:.0f}s); replay it "
                    "closer to its time"
                )
                return Category.INVALID, reason, "EtaBeyondVisibility"
        return None

    def refuse(self, message: Any, category: Category, reason: str, exc_type: str) -> None:
        """Dead-letter a refused message, store a small FAILURE for a caller waiting on
        a known task's result, and ack it."""
        kwargs = job_kwargs(message) if exc_type in REPLAYABLE else None
        headers = message.headers if isinstance(message.headers, dict) else {}
        task_id, name = headers.get("id"), headers.get("task")
        task = self.app.tasks.get(name) if isinstance(name, str) else None
        if exc_type == NEWER_FORMAT and isinstance(task_id, str):
            give_back_key(task, task_id, headers)  # else its replay is deduplicated
        record(self, message, category, reason, None, exc_type=exc_type, payload=kwargs)
        if isinstance(task_id, str) and task is not None and not task.ignore_result:
            request = SimpleNamespace(
                name=name, chord=None, root_id=None, errbacks=None, reply_to=None,
                correlation_id=task_id, ignore_result=False,
            )  # fmt: skip
            try:
                self.app.backend.mark_as_failure(
                    task_id, Reject(reason, requeue=False), request=request, call_errbacks=False
                )
            except Exception:
                logger.warning("could not store the failure of %s", task_id, exc_info=True)
        message.ack_log_error(logger, self.connection_errors)

    def max_message_bytes(self) -> int:
        """``conventions_max_message_bytes``, or the default."""
        return int(self.app.conf.get("conventions_max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES)

    def connection_for_read(self, heartbeat: Any = None) -> Any:
        """Celery's, with the size cap the layer's Redis transport weighs each entry
        against before decoding it (other transports ignore the option; RabbitMQ's
        messages are weighed by :meth:`refusal`)."""
        cap = {"max_message_bytes": envelope.entry_cap(self.max_message_bytes())}
        return self.ensure_connected(
            self.app.connection_for_read(heartbeat=heartbeat, transport_options=cap)
        )

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's handler, made to survive a message that raises in it, behind the
        refusals of :meth:`refusal`."""
        handle = super().create_task_handler(*args, **kwargs)
        fatal = tuple(self.connection_errors) + tuple(self.channel_errors)
        max_bytes = self.max_message_bytes()

        def on_task_received(message: Any) -> Any:
            try:
                refused = self.refusal(message, max_bytes)
                if refused is not None:
                    self.refuse(message, *refused)
                    return None
                return handle(message)
            except fatal:
                raise
            except Exception as exc:
                reason = f"malformed task message ({type(exc).__qualname__}: {exc})"
                record(self, message, Category.UNPARSEABLE, reason, exc)
                message.ack_log_error(logger, self.connection_errors)
                return None

        return on_task_received
