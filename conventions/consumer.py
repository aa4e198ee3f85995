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
"""

from __future__ import annotations

import base64
import logging
import socket
import traceback as tb
import uuid
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

from conventions import audit, context
from conventions.deadletter import MAX_MESSAGE, MAX_TRACEBACK, scrub
from conventions.records import Category, DeadLetter, utcnow

logger = logging.getLogger("conventions.consumer")

#: the most of a raw body a record keeps (bytes, before encoding)
MAX_RAW_BODY = 16384


def raw_body(message: Any) -> dict[str, Any]:
    """The message's body as it arrived: text when it is UTF-8 (scrubbed), else base64;
    cut to ``MAX_RAW_BODY`` bytes; with its content type and encoding."""
    body = message.body
    data = body if isinstance(body, bytes) else str(body).encode("utf-8", "replace")
    kept: dict[str, Any] = {
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "size": len(data),
        "truncated": len(data) > MAX_RAW_BODY,
    }
    data = data[:MAX_RAW_BODY]
    try:
        kept["raw_body"] = scrub(data.decode("utf-8"), MAX_RAW_BODY)
    except UnicodeDecodeError:
        kept["raw_body_base64"] = base64.b64encode(data).decode("ascii")
    return kept


def record(
    consumer: Any, message: Any, category: Category, reason: str, exc: BaseException | None
) -> DeadLetter | None:
    """Write the dead letter of a message the consumer cannot run; None when the app has
    no store or the store cannot be reached (the message is then only logged, as Celery
    does: it is never requeued, so a bad message cannot spin a worker)."""
    store = getattr(consumer.app, "store", None)
    headers = message.headers if isinstance(message.headers, dict) else {}
    trace = "".join(tb.format_exception(exc)) if exc is not None else ""
    now = utcnow()
    delivery = message.delivery_info or {}
    record_id = uuid.uuid4().hex
    # a message with no correlation id of ours gets one here, as at any other receipt
    correlation = str(headers.get(context.CORRELATION) or record_id)
    dead = DeadLetter(
        id=record_id,
        task=str(headers.get("task") or ""),
        task_id=str(headers.get("id") or ""),
        category=category,
        payload=raw_body(message),
        headers={str(k): v for k, v in headers.items()},
        idempotency_key=headers.get(context.IDEMPOTENCY_KEY),
        exc_type=type(exc).__qualname__ if exc is not None else "UnknownMessage",
        message=scrub(reason, MAX_MESSAGE),
        traceback=scrub(trace, MAX_TRACEBACK),
        attempts=1,
        first_failed_at=now,
        last_failed_at=now,
        worker=str(getattr(consumer, "hostname", None) or socket.gethostname()),
        queue=delivery.get("routing_key"),
        correlation_id=correlation,
    )
    try:
        if store is None:
            raise LookupError("the app has no conventions store")
        store.put_dead_letter(dead)
    except Exception:
        logger.exception("could not keep a message the worker cannot run (%s)", reason)
        return None
    # the audit event moves the dead-letter counter of the metrics, as for a job's
    traced = {**headers, context.CORRELATION: correlation}
    audit.record(
        store, "dead_lettered", dead.task, dead.task_id, traced,
        detail={"category": str(category), "dead_letter_id": dead.id, "reason": dead.message},
    )  # fmt: skip
    logger.error(
        "message %s dead-lettered as %s (%s): %s", dead.task_id or "-", category, dead.id, reason
    )
    return dead


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, with a dead letter for every message it cannot run."""

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

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's handler, made to survive a message that raises in it."""
        handle = super().create_task_handler(*args, **kwargs)
        fatal = tuple(self.connection_errors) + tuple(self.channel_errors)

        def on_task_received(message: Any) -> Any:
            try:
                return handle(message)
            except fatal:
                raise
            except Exception as exc:
                reason = f"malformed task message ({type(exc).__qualname__}: {exc})"
                record(self, message, Category.UNPARSEABLE, reason, exc)
                message.ack_log_error(logger, self.connection_errors)
                return None

        return on_task_received
