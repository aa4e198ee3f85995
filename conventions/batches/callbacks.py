"""A batch's callbacks: published by whoever ended the batch, and by the sweep after a crash.

The store makes a callback *due* in the same step as the member's end that ends the
batch (:mod:`conventions.store.batches`); the worker whose completion did it publishes the
callback right after, then marks it *sent*. A worker killed between the two leaves it
due: every worker's main process runs a sweep (:class:`Sweeper`, every
:data:`SWEEP_INTERVAL` seconds) that publishes again the callbacks due for longer than
:data:`SWEEP_GRACE`. A callback published twice is still one job: its task id is the
batch's (:func:`~conventions.store.batches.callback_task_id`) and its idempotency key
is derived from the ``batch_id`` its payload carries, so the ledger runs its body once.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Iterable
from typing import Any, Final

from conventions.errors import ConfigurationError, KeyConflict, PayloadError
from conventions.observability import audit
from conventions.observability.deadletters import MAX_MESSAGE, scrub
from conventions.store import batches as b
from conventions.store.records import Category, DeadLetter, utcnow

logger = logging.getLogger("conventions.batches")

#: seconds a due callback waits before the sweep publishes it again (its publisher
#: normally marks it sent within milliseconds)
SWEEP_GRACE: Final = 30.0
#: seconds between two sweeps of a worker
SWEEP_INTERVAL: Final = 15.0
#: the payload field a callback gets the batch id in
BATCH_FIELD: Final = "batch_id"
#: the namespace of an unpublishable callback's dead-letter id (uuid5 of its task id)
_DEAD_LETTERS: Final = uuid.UUID("0b7c1d52-8f0e-5a43-b6c4-3e9d2a1f7c58")


def callback_kwargs(signature: dict[str, Any], batch_id: str) -> dict[str, Any]:
    """The callback's payload: its signature's kwargs and the batch id."""
    return {**(signature.get("kwargs") or {}), BATCH_FIELD: batch_id}


def publish_due(app: Any, fired: Iterable[str]) -> int:
    """Publish the callbacks ``fired`` (``<batch id>|<callback>``) and mark each sent;
    how many were published. A failure is logged, never raised: the callback stays due
    and the sweep publishes it, unless it can never be published as it is
    (:class:`Unpublishable`): it then becomes a dead letter of its own and leaves the
    sweep, so that it never holds back the others."""
    sent = 0
    for item in fired:
        batch_id, _, which = item.rpartition("|")
        try:
            publish_one(app, batch_id, which)
            sent += 1
        except Unpublishable as refused:
            _dead_letter(app, batch_id, which, refused)
        except Exception:
            logger.exception("batch %s: its %s callback was not published; the sweep will",
                             batch_id, which)  # fmt: skip
    return sent


class Unpublishable(Exception):
    """A due callback that no publish can send as it is: its task is not registered (a
    renamed or removed job), or its payload or key is refused."""

    def __init__(self, signature: dict[str, Any], category: Category, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.signature, self.category, self.cause = signature, category, cause


def publish_one(app: Any, batch_id: str, which: str) -> None:
    """Publish one due callback, then mark it sent; :class:`Unpublishable` when it can
    never be published as it is."""
    store = app.store
    status = store.get_batch(batch_id, members=False)
    if status is None or which not in status.callbacks:
        store.callback_sent(batch_id, which)  # nothing to publish: not due any more
        return
    signature = status.callbacks[which]
    task = app.tasks.get(signature["task"])
    if task is None:
        refused = LookupError(f"task {signature['task']!r} is not registered in this process")
        raise Unpublishable(signature, Category.INVALID, refused)
    try:
        task.apply_async(
            kwargs=callback_kwargs(signature, batch_id),
            task_id=b.callback_task_id(batch_id, which),
        )
    except KeyConflict as exc:
        raise Unpublishable(signature, Category.CONFLICT, exc) from exc
    except (PayloadError, ConfigurationError) as exc:
        raise Unpublishable(signature, Category.INVALID, exc) from exc
    store.callback_sent(batch_id, which)
    logger.info("batch %s: %s callback %s published", batch_id, which, signature["task"])


def _dead_letter(app: Any, batch_id: str, which: str, refused: Unpublishable) -> None:
    """Keep an unpublishable callback as a dead letter (its payload whole, replayable
    once its task or payload is mended), then mark it sent: it leaves the sweep. The
    record's id is the callback's own, so a sweep that dies between the two writes the
    same record again, not a second one."""
    store = app.store
    task_id = b.callback_task_id(batch_id, which)
    now = utcnow()
    record = DeadLetter(
        id=uuid.uuid5(_DEAD_LETTERS, task_id).hex,
        task=str(refused.signature["task"]),
        task_id=task_id,
        category=refused.category,
        payload=callback_kwargs(refused.signature, batch_id),
        headers={},
        idempotency_key=None,
        exc_type=type(refused.cause).__name__,
        message=scrub(f"batch {batch_id}: its {which} callback cannot be published: "
                      f"{refused.cause}", MAX_MESSAGE),
        traceback="",
        attempts=1,
        first_failed_at=now,
        last_failed_at=now,
        worker=socket.gethostname(),
    )  # fmt: skip
    try:
        store.put_dead_letter(record)
        store.callback_sent(batch_id, which)
    except Exception:
        logger.exception("batch %s: its %s callback cannot be published and could not be "
                         "dead-lettered; the sweep will try again", batch_id, which)  # fmt: skip
        return
    audit.record(
        store, "dead_lettered", record.task, task_id, {},
        detail={"category": str(record.category), "dead_letter_id": record.id,
                "reason": record.message},
    )  # fmt: skip
    logger.error("batch %s: its %s callback cannot be published (%s); dead letter %s: replay "
                 "it once the job is mended", batch_id, which, refused, record.id)  # fmt: skip


def sweep(app: Any, grace: float = SWEEP_GRACE) -> int:
    """Publish the callbacks left due for longer than ``grace`` seconds (a publisher that
    died); how many."""
    return publish_due(app, app.store.due_callbacks(grace))


class Sweeper(threading.Thread):
    """A daemon thread of the worker's main process that runs :func:`sweep`."""

    def __init__(self, app: Any, interval: float = SWEEP_INTERVAL) -> None:
        super().__init__(name="conventions-batch-sweep", daemon=True)
        self.app, self.interval = app, interval
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                sweep(self.app)
            except Exception:  # a store that does not answer: the next sweep
                logger.warning("batch sweep failed; next in %.0fs", self.interval, exc_info=True)


_sweepers: dict[int, Sweeper] = {}
_lock = threading.Lock()


def start(app: Any) -> None:
    """Start ``app``'s sweeper in this process (once)."""
    with _lock:
        current = _sweepers.get(id(app))
        if current is not None and current.is_alive():
            return
        _sweepers[id(app)] = sweeper = Sweeper(app)
        sweeper.start()


def stop(app: Any) -> None:
    """Stop ``app``'s sweeper, if it runs."""
    with _lock:
        sweeper = _sweepers.pop(id(app), None)
    if sweeper is not None:
        sweeper.stopping.set()
