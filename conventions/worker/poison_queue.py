"""The consumer of RabbitMQ's poison queue: a message the broker dead-lettered at its
delivery limit becomes the layer's ``poison`` dead letter, acked only once written.

Every workload quorum queue dead-letters to the layer's poison exchange and queue
(:mod:`conventions.transport.amqp_queues`). RabbitMQ puts a message there when it was
delivered ``x-delivery-limit`` times without an ack (its worker died each time before the
layer's own poison detection could claim it), or when a worker rejected it without
requeue: the layer rejects only after writing its own record, so those are acked and
dropped here (logged), never recorded twice.

Each worker on RabbitMQ's quorum queues runs one :class:`PoisonQueueConsumer` (a thread
of the main process, started at ``worker_ready`` by :mod:`conventions.worker.wiring`).
It takes one message at a time; with the store down it keeps the message unacked and
tries again with a growing pause (the message stays in RabbitMQ: nothing is lost, and a
consumer that dies gives it back). The record's id is derived from the message's task
id and first death, so a message recorded and then delivered again (the ack lost)
overwrites its own record. :func:`drain` runs the same handling once, in the foreground.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import uuid
from collections.abc import Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from celery.exceptions import Reject

from conventions.batches import callbacks as batch_callbacks
from conventions.config import settings
from conventions.observability import audit
from conventions.observability.deadletters import MAX_MESSAGE, capped_headers, scrub
from conventions.store import keys
from conventions.store.records import Category, DeadLetter, utcnow
from conventions.tracing import headers as hdr
from conventions.transport import amqp_queues
from conventions.worker import batch_ends
from conventions.worker.consumer import DEFAULT_MAX_MESSAGE_BYTES, job_kwargs, raw_body

logger = logging.getLogger("conventions.worker.poison_queue")

#: the record ids' namespace (a record id is uuid5 of the task id and its first death)
NAMESPACE = uuid.UUID("5b0e3f4c-9a51-4f0e-8d0c-2b7c1e0a25ad")
#: pauses between two tries to write a record while the store is down (seconds)
FIRST_PAUSE, LONGEST_PAUSE = 1.0, 30.0
#: how long one wait for a message lasts before the stop flag is looked at (seconds)
POLL = 1.0
#: the x-death reason of a message a worker rejected without requeue (already recorded)
REJECTED = "rejected"
#: the x-death reason of a message delivered past its queue's ``x-delivery-limit``
DELIVERY_LIMIT = "delivery_limit"


def deaths(headers: Mapping[str, Any]) -> list[dict[str, Any]]:
    """RabbitMQ's ``x-death`` entries, newest first (empty when there are none)."""
    found = headers.get("x-death")
    return [dict(d) for d in found if isinstance(d, Mapping)] if isinstance(found, list) else []


def last_death(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The entry of the death that brought the message here: the newest whose queue is
    not one of Celery's delay queues (those expire on purpose)."""
    for death in deaths(headers):
        if not str(death.get("queue", "")).startswith("celery_delayed_"):
            return death
    return {}


def reason_of(headers: Mapping[str, Any], limit: int) -> str:
    """Why the broker dead-lettered the message, from its ``x-death`` entry (reason,
    queue, time, how many times) and the delivery limit, in one line."""
    death = last_death(headers)
    why, queue = death.get("reason", "unknown"), death.get("queue", "?")
    when = death.get("time")
    at = f" at {when.isoformat()}" if isinstance(when, datetime) else ""
    times = death.get("count")
    again = f", dead-lettered {times} times" if isinstance(times, int) and times > 1 else ""
    if why != DELIVERY_LIMIT:  # expired (a message's own ``expires``), maxlen: said so
        return (
            f"dead-lettered by RabbitMQ from queue {queue!r}{at}: {why}{again}; it never "
            "reached a worker's run"
        )
    return (
        f"dead-lettered by RabbitMQ from queue {queue!r}{at}: {why} (x-delivery-limit "
        f"{limit}: delivered {limit + 1} times without an ack{again}); the job kept its "
        "worker from acking it (a crash, a kill, a lost connection) before the layer "
        "could quarantine it"
    )


def record_id(headers: Mapping[str, Any]) -> str:
    """The same id for every delivery of one dead-lettered message."""
    death = last_death(headers)
    seed = f"{headers.get('id')}:{death.get('queue')}:{death.get('time')}:{death.get('count')}"
    return uuid.uuid5(NAMESPACE, seed).hex


def batch_record_id(headers: Mapping[str, Any], member: batch_ends.MemberEnd) -> str:
    """:func:`record_id` drawn in the partition of ``member``'s batch tree: the same for
    every delivery of one message, and written in the batch's slot on Redis Cluster."""
    seeds = iter(range(1 << 20))
    base = record_id(headers)
    return member.record_id(lambda: uuid.uuid5(NAMESPACE, f"{base}:{next(seeds)}").hex)


def dead_letter_of(app: Any, message: Any, worker: str) -> DeadLetter:
    """The ``poison`` record of a dead-lettered message: its kwargs when it is a
    well-formed job (so that it replays), else its raw body; a body over
    ``conventions_max_message_bytes`` is never decoded (its head is kept)."""
    headers = message.headers if isinstance(message.headers, dict) else {}
    death = last_death(headers)
    limit = settings.delivery_limit(app.conf)
    cap = int(app.conf.get("conventions_max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES)
    body = message.body
    small = not isinstance(body, bytes | str) or len(body) <= cap
    kwargs = job_kwargs(message) if small else None
    correlation = hdr.read_header(hdr.CORRELATION, headers.get(hdr.CORRELATION))
    now = utcnow()
    first = death.get("time")
    return DeadLetter(
        id=record_id(headers),
        task=str(headers.get("task") or "")[:200],
        task_id=str(headers.get("id") or "")[:200],
        category=Category.POISON,
        payload=kwargs if kwargs is not None else raw_body(message),
        headers=capped_headers({k: v for k, v in headers.items() if k != "x-death"}),
        idempotency_key=hdr.read_header(hdr.IDEMPOTENCY_KEY, headers.get(hdr.IDEMPOTENCY_KEY)),
        exc_type="DeliveryLimitExceeded"
        if death.get("reason") == DELIVERY_LIMIT
        else "DeadLettered",
        message=scrub(reason_of(headers, limit), MAX_MESSAGE),
        traceback="",
        attempts=limit + 1,  # the deliveries in its queue (x-delivery-count is the
        # poison queue's own, and RabbitMQ drops the source's at dead-lettering)
        first_failed_at=first if isinstance(first, datetime) else now,
        last_failed_at=now,
        worker=worker,
        queue=str(death.get("queue") or "") or None,
        correlation_id=str(correlation or headers.get("id") or ""),
    )


def handle(app: Any, message: Any, worker: str) -> bool:
    """Record one message of the poison queue; True when it may be acked (recorded, or
    a rejection the worker recorded itself), False when the store did not take it."""
    headers = message.headers if isinstance(message.headers, dict) else {}
    if last_death(headers).get("reason") == REJECTED:
        logger.info(
            "poison queue: %s was rejected by its worker, which recorded it: dropped",
            headers.get("id") or "-",
        )
        return True
    dead = dead_letter_of(app, message, worker)
    key = keys.namespaced(dead.task, dead.idempotency_key) if dead.idempotency_key else None
    member = batch_ends.member_of(headers, dead.task)
    move = None
    if member is not None:  # its id in its batch's partition, as stable (keys.batch_home)
        dead = dataclasses.replace(dead, id=batch_record_id(headers, member))
        move = member.failed(dead.task_id, dead.id)
    try:
        store = app.store
        with keys.batch_home(key, member.root if member else None):
            if key and dead.task:  # the producer's reservation, as the layer's own dead
                # letters drop it: else a replay would dedup against it
                store.unreserve(key, dead.task_id)
            # a batch member ends as failed in the same step (else its batch never ends)
            fired = store.put_dead_letter(dead, batch=move) if move else None
            if move is None:
                store.put_dead_letter(dead)
    except Exception as exc:
        logger.warning("poison queue: cannot record %s yet: %r", dead.task_id or "-", exc)
        return False
    if fired:
        batch_callbacks.publish_due(app, fired)
    traced = {**hdr.read_headers(headers)[0], hdr.CORRELATION: dead.correlation_id}
    audit.record(
        store, "dead_lettered", dead.task, dead.task_id, traced,
        detail={"category": str(Category.POISON), "dead_letter_id": dead.id,
                "reason": dead.message},
    )  # fmt: skip
    logger.error("message %s dead-lettered as poison (%s): %s", dead.task_id, dead.id, dead.message)
    settle_result(app, dead)
    return True


def settle_result(app: Any, dead: DeadLetter) -> None:
    """A FAILURE result for a caller waiting on ``.get()`` of a known task (as the layer's
    own quarantine stores one); best effort: the record is what counts."""
    task = app.tasks.get(dead.task) if dead.task else None
    if task is None or task.ignore_result or not dead.task_id or not app.conf.result_backend:
        return
    request = SimpleNamespace(
        name=dead.task, chord=None, root_id=None, errbacks=None, reply_to=None,
        correlation_id=dead.task_id, ignore_result=False,
    )  # fmt: skip
    failure = Reject(f"{dead.message} [dead letter {dead.id}]", requeue=False)
    try:
        app.backend.mark_as_failure(dead.task_id, failure, request=request, call_errbacks=False)
    except Exception:
        logger.warning("could not store the failure of %s", dead.task_id, exc_info=True)


class PoisonQueueConsumer(threading.Thread):
    """One consumer of the poison queue, on a connection of its own."""

    def __init__(self, app: Any, worker: str | None = None) -> None:
        super().__init__(name="conventions-poison-queue", daemon=True)
        self.app = app
        self.worker = worker or socket.gethostname()
        self.stopping = threading.Event()
        #: messages recorded (or dropped as already recorded) and acked
        self.acked = 0

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        pause = FIRST_PAUSE
        while not self.stopping.is_set():
            try:
                self.consume()
                pause = FIRST_PAUSE
            except Exception as exc:  # the broker went away: connect again, later
                logger.warning("poison queue: consumer lost its broker (%r); reconnecting", exc)
                self.stopping.wait(pause)
                pause = min(pause * 2, LONGEST_PAUSE)

    def consume(self) -> None:
        with self.app.connection_for_read() as connection:
            channel = connection.channel()
            queue = amqp_queues.poison_queue(self.app.conf)(channel)
            queue.declare()
            channel.basic_qos(0, 1, False)
            # on_message: kombu hands the raw message over, decoding nothing; the record
            # decodes only what the app accepts (JSON: never pickle from a queue anyone
            # can dead-letter into)
            with connection.Consumer(
                queue, on_message=self.on_raw, accept=accepted(self.app), channel=channel
            ):
                while not self.stopping.is_set():
                    try:
                        connection.drain_events(timeout=POLL)
                    except TimeoutError:
                        continue

    def on_raw(self, message: Any) -> None:
        self.on_message(None, message)

    def on_message(self, body: Any, message: Any) -> None:
        pause = FIRST_PAUSE
        while not handle(self.app, message, self.worker):
            if self.stopping.wait(pause):  # stopping: unacked, it goes back to the queue
                return  # when this consumer's connection closes (never redelivered here)
            pause = min(pause * 2, LONGEST_PAUSE)
        message.ack()
        self.acked += 1


def drain(app: Any, *, worker: str | None = None) -> tuple[int, int]:
    """Record what the poison queue holds now, in the foreground: ``(acked, left)``,
    ``left`` counting the messages the store did not take (given back, unacked)."""
    acked = left = 0
    with app.connection_for_read() as connection:
        channel = connection.channel()
        queue = amqp_queues.poison_queue(app.conf)(channel)
        queue.declare()
        while True:
            message = queue.get(no_ack=False, accept=accepted(app))
            if message is None:
                break
            if handle(app, message, worker or socket.gethostname()):
                message.ack()
                acked += 1
            else:
                message.requeue()
                left += 1
                break
    return acked, left


def accepted(app: Any) -> list[str]:
    """The content types a record may decode (the app's ``accept_content``, JSON by the
    profile): anything else is kept as its raw body, never deserialized."""
    return list(app.conf.get("accept_content") or ["json"])


_running: dict[int, PoisonQueueConsumer] = {}


def start(app: Any, worker: str | None = None) -> PoisonQueueConsumer | None:
    """Start the app's poison-queue consumer (once), when its queues are quorum queues."""
    if not settings.quorum_queues(app.conf) or id(app) in _running:
        return _running.get(id(app))
    consumer = _running[id(app)] = PoisonQueueConsumer(app, worker)
    consumer.start()
    return consumer


def stop(app: Any) -> None:
    consumer = _running.pop(id(app), None)
    if consumer is not None:
        consumer.stop()
