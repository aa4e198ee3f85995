"""Pausing a queue fleet-wide: the workers stop taking from it, until resumed.

A pause keeps a ``queue:paused:<name>`` state document in the store (who paused it,
when, why, and which workers stopped), then broadcasts Celery's ``cancel_consumer``
(each worker logs ``Canceling queue <name>`` and stops fetching from it within its next
fetch; the jobs it runs finish). A resume removes the document, then broadcasts
``conventions_resume_queue`` to every worker: each one that holds the queue paused (one
of its own queues, which it does not consume) consumes it again, whether or not its
reply to the pause came in time. Workers of an older version, which do not know that
command, get Celery's ``add_consumer``, as before, if they are in the document. Both are
audited under the correlation id ``queue:<name>`` (``conventions trace queue:email``).

A broadcast can miss a worker (starting, reconnecting): each worker also reads the
documents of its own queues at start and every few seconds
(``conventions.worker.queue_pauses``), so a worker started while the queue is paused
does not consume it, and one that missed the resume consumes it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from conventions.observability.pauses import Pauses

#: how long a pause or resume waits for the workers' replies (seconds): a reply that
#: comes later only leaves the worker out of the lists shown, never out of the resume
REPLY_TIMEOUT = 1.0
#: the remote control command a resume broadcasts (``conventions.worker.queue_pauses``)
RESUME_COMMAND = "conventions_resume_queue"
#: what a worker that consumes the queue again answers to it
RESUMED = "consuming again"


#: the queues' pause records (``queue:paused:<name>``, audited under ``queue:<name>``)
QUEUES = Pauses("queue")


def _workers(replies: Any) -> list[str]:
    return sorted(name for reply in replies or [] for name in reply)


def pause(app: Any, queue: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Stop every worker consuming ``queue``; return the pause document."""
    document: dict[str, Any] = {
        "queue": queue,
        "actor": actor,
        "reason": reason,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "workers": [],
    }
    QUEUES.keep(app.store, queue, document)  # first: a worker that looks from now stops
    # the pause is in force from here (each worker reads the record every WATCH_EVERY
    # seconds): a broker that does not answer the broadcast changes that for no worker,
    # so the pause is audited either way, and the document says the broadcast failed
    replies, missed = _broadcast(
        lambda: app.control.cancel_consumer(queue, reply=True, timeout=REPLY_TIMEOUT)
    )
    current = QUEUES.get(app.store, queue)  # with the workers that joined meanwhile
    if current is not None:  # else resumed meanwhile: not paused again
        joined = current.get("workers", [])
        document = {**current, "workers": sorted({*joined, *_workers(replies)})}
        QUEUES.keep(app.store, queue, document)
    audited = {**document, "broadcast": missed} if missed else document
    QUEUES.audit(app.store, "queue_paused", f"queue.{queue}", queue, audited)
    return audited


@dataclass(frozen=True)
class Resumed:
    """What a resume did: the workers that answered in time that they consume the queue
    again, and why the broadcast did not go out ("" when it did: the record is gone
    either way, and every worker follows it)."""

    workers: list[str]
    missed: str = ""


def resume(app: Any, queue: str, *, actor: str) -> Resumed:
    """Let every worker that holds ``queue`` paused consume it again."""
    document = QUEUES.get(app.store, queue) or {}
    QUEUES.drop(app.store, queue)  # first: a worker that looks from now consumes it
    replies, missed = _broadcast(
        lambda: app.control.broadcast(
            RESUME_COMMAND, arguments={"queue": queue}, reply=True, timeout=REPLY_TIMEOUT
        )
    )
    answers = {name: answer for reply in replies or [] for name, answer in reply.items()}
    resumed = {name for name, answer in answers.items() if _said(answer, RESUMED)}
    # an older worker answers an error (it does not know the command), or nothing
    older = [str(w) for w in document.get("workers", []) if not _said(answers.get(str(w)), None)]
    if older and not missed:
        added, missed = _broadcast(
            lambda: app.control.add_consumer(
                queue, destination=older, reply=True, timeout=REPLY_TIMEOUT
            )
        )
        resumed.update(_workers(added))
    detail: dict[str, Any] = {"actor": actor, "workers": sorted(resumed)}
    if missed:
        detail["broadcast"] = missed
    QUEUES.audit(app.store, "queue_resumed", f"queue.{queue}", queue, detail)
    return Resumed(sorted(resumed), missed)


def _broadcast(send: Callable[[], Any]) -> tuple[Any, str]:
    """A broadcast's replies, and why it did not go out ("" when it did): a broker that
    does not answer leaves the record as the one thing the workers go by."""
    try:
        return send(), ""
    except Exception as exc:  # kombu's connection errors differ by transport
        return [], f"not sent: the broker did not answer ({type(exc).__name__}: {exc})"[:300]


def _said(answer: Any, what: str | None) -> bool:
    """Whether a worker's reply is ``{"ok": what}`` (any ``ok`` when ``what`` is None)."""
    if not isinstance(answer, dict) or "ok" not in answer:
        return False
    return what is None or answer["ok"] == what
