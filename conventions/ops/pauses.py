"""Pausing a queue fleet-wide: the workers stop taking from it, until resumed.

A pause broadcasts Celery's ``cancel_consumer`` (each worker logs ``Canceling queue
<name>`` and stops fetching from it within its next fetch; the jobs it runs finish) and
keeps a ``queue:paused:<name>`` state document in the store: who paused it, when, why,
and which workers answered. A resume broadcasts ``add_consumer`` to those workers only
(a worker that never consumed the queue is not made to) and removes the document. Both
are audited under the correlation id ``queue:<name>`` (``conventions trace queue:email``).

A worker started while the queue is paused must not consume it: ``at_start(app,
consumer)``, called from ``worker_ready`` (whose sender is the worker's consumer), reads
the documents, stops consuming each paused queue, says so in the log and joins the
document's workers, so that the resume reaches it too.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from conventions.observability.pauses import Pauses

logger = logging.getLogger("conventions.ops.pauses")

#: how long a pause or resume waits for the workers' replies (seconds)
REPLY_TIMEOUT = 1.0


#: the queues' pause records (``queue:paused:<name>``, audited under ``queue:<name>``)
QUEUES = Pauses("queue")


def _workers(replies: Any) -> list[str]:
    return sorted(name for reply in replies or [] for name in reply)


def pause(app: Any, queue: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Stop every worker consuming ``queue``; return the pause document."""
    replies = app.control.cancel_consumer(queue, reply=True, timeout=REPLY_TIMEOUT)
    document = {
        "queue": queue,
        "actor": actor,
        "reason": reason,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "workers": _workers(replies),
    }
    QUEUES.keep(app.store, queue, document)
    QUEUES.audit(app.store, "queue_paused", f"queue.{queue}", queue, document)
    return document


def resume(app: Any, queue: str, *, actor: str) -> list[str]:
    """Let the workers that were paused consume ``queue`` again; return their names."""
    document = QUEUES.get(app.store, queue) or {}
    workers = [str(w) for w in document.get("workers", [])]
    answered: list[str] = []
    if workers:
        replies = app.control.add_consumer(
            queue, destination=workers, reply=True, timeout=REPLY_TIMEOUT
        )
        answered = _workers(replies)
    QUEUES.drop(app.store, queue)
    detail = {"actor": actor, "workers": answered}
    QUEUES.audit(app.store, "queue_resumed", f"queue.{queue}", queue, detail)
    return answered


def at_start(app: Any, consumer: Any) -> list[str]:
    """A starting worker's part: stop consuming the paused queues among those it was
    told to consume; return them. Never raises (a store that does not answer leaves the
    worker consuming, and says so)."""
    try:
        names = [q.name for q in consumer.task_consumer.queues] if consumer.task_consumer else []
        held = QUEUES.get_many(app.store, names)
        for queue, document in held.items():
            consumer.call_soon(consumer.cancel_task_queue, queue)
            logger.warning(
                "queue %s is paused (by %s at %s: %s): not consuming it until resumed",
                queue, document.get("actor"), document.get("at"), document.get("reason"),
            )  # fmt: skip
            workers = sorted({*document.get("workers", []), str(consumer.hostname)})
            QUEUES.keep(app.store, queue, {**document, "workers": workers})
        return sorted(held)
    except Exception:
        logger.exception("could not read the paused queues: consuming every queue")
        return []
