"""A worker's side of queue pauses (``conventions.ops.pauses``): whatever the timing.

A pause and a resume are broadcasts, and a broadcast can miss a worker: it is starting,
or reconnecting, or its reply comes after the operator stopped waiting. So the worker
does not depend on them alone; it keeps its own view, in a :class:`Watch`:

* at ``worker_init``: its own queues (its ``-Q`` selection), and the resume command
  (``conventions_resume_queue``) registered with Celery's remote control;
* at ``worker_ready`` (:func:`start`): it reads the pause documents of its own queues,
  stops consuming those paused and says so in its log (:func:`at_start`), then looks
  again every :data:`WATCH_EVERY` seconds in a daemon thread: an own queue it still
  consumes while paused is stopped (a pause broadcast it missed), and a queue it stopped
  for a pause whose document is gone is consumed again (a resume it missed);
* the resume command, broadcast to every worker: a worker consumes the queue again if
  it is one of its own and it is not consuming it, whether or not it answered the pause
  in time.

A queue cancelled by hand (``celery control cancel_consumer``) without a pause document
is left alone. Queues added at run time (``add_consumer``) count as the worker's own.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from celery.worker.control import Panel

from conventions.ops.pauses import QUEUES, RESUME_COMMAND, RESUMED

logger = logging.getLogger("conventions.worker.queue_pauses")

#: how often (seconds) a worker reads the pause documents of its own queues
WATCH_EVERY = 5.0
#: what a worker answers to a resume of a queue it does not hold paused
NOT_HELD = "not paused here"


@dataclass
class Watch:
    """One worker's view of its own queues and of those it stopped for a pause."""

    app: Any
    hostname: str
    #: the queues this worker consumes when nothing is paused
    own: set[str]
    #: the own queues it stopped because of a pause (it consumes them again on resume)
    held: set[str] = field(default_factory=set)
    consumer: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def consuming(self) -> set[str]:
        """The queues the consumer takes from now (none while it reconnects)."""
        consumer = self.consumer
        tasks = getattr(consumer, "task_consumer", None)
        return {q.name for q in list(tasks.queues)} if tasks is not None else set()

    def look(self) -> list[str]:
        """Read the pause documents of the own queues and act on them; return the queues
        it stopped. Raises when the store does not answer."""
        if getattr(self.consumer, "task_consumer", None) is None:
            return []  # not started, or reconnecting: the next look acts
        with self._lock:
            self.own |= self.consuming()
            own = sorted(self.own)
        documents = QUEUES.get_many(self.app.store, own)
        consuming = self.consuming()
        stopped = [queue for queue in documents if queue in consuming]
        with self._lock:
            self.held |= set(documents)
            back = sorted(self.held - set(documents) - consuming)
            self.held -= self.held - set(documents)
        for queue in stopped:
            self.consumer.call_soon(self.consumer.cancel_task_queue, queue)
            self._join(queue, documents[queue])
        for queue in back:
            logger.info("queue %s is no longer paused: consuming it again", queue)
            self.consumer.call_soon(self.consumer.add_task_queue, queue)
        return stopped

    def _join(self, queue: str, document: dict[str, Any]) -> None:
        """Say so in the log, and join the document's workers (an older resume tells
        only those)."""
        logger.warning(
            "queue %s is paused (by %s at %s: %s): not consuming it until resumed",
            queue, document.get("actor"), document.get("at"), document.get("reason"),
        )  # fmt: skip
        current = QUEUES.get(self.app.store, queue)
        if current is not None:  # not resumed meanwhile
            workers = sorted({*current.get("workers", []), self.hostname})
            QUEUES.keep(self.app.store, queue, {**current, "workers": workers})

    def resume(self, queue: str) -> str:
        """The resume command's part: consume ``queue`` again if it is an own queue
        this worker does not consume."""
        with self._lock:
            mine = queue in self.own or queue in self.held
            self.held.discard(queue)
        if not mine or self.consumer is None or queue in self.consuming():
            return NOT_HELD
        self.consumer.call_soon(self.consumer.add_task_queue, queue)
        logger.info("queue %s resumed: consuming it again", queue)
        return RESUMED

    def start(self) -> None:
        """Look again every :data:`WATCH_EVERY` seconds, in a daemon thread."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name="conventions-queue-pauses", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_EVERY):
            try:
                self.look()
            except Exception as exc:
                logger.warning("could not read the paused queues (%s); trying again in %gs",
                               type(exc).__qualname__, WATCH_EVERY)  # fmt: skip


_watches: dict[str, Watch] = {}
_lock = threading.Lock()


def watch_of(app: Any, hostname: str, consumer: Any = None) -> Watch:
    """The worker ``hostname``'s watch (its own queues: the consumer's, when
    :func:`on_init` did not record them)."""
    with _lock:
        found = _watches.get(hostname)
        if found is None or found.app is not app:
            found = Watch(app, hostname, set())
            _watches[hostname] = found
    if consumer is not None:
        found.consumer = consumer
        with found._lock:
            found.own |= found.consuming()
    return found


def on_init(app: Any, worker: Any) -> None:
    """``worker_init``: record the worker's own queues (before any pause stops one) and
    register the resume command."""
    selected = set(app.amqp.queues.consume_from)  # the -Q selection, else every queue
    with _lock:
        _watches[str(worker.hostname)] = Watch(app, str(worker.hostname), selected)
    Panel.register(type="control", name=RESUME_COMMAND, args=[("queue", str)],
                   signature="<queue>")(_resume_command)  # fmt: skip


def _resume_command(state: Any, queue: str, **_: Any) -> dict[str, str]:
    """Consume ``queue`` again if this worker holds it paused (``conventions.ops.pauses``)."""
    consumer = state.consumer
    return {"ok": watch_of(consumer.app, str(consumer.hostname), consumer).resume(queue)}


def at_start(app: Any, consumer: Any) -> list[str]:
    """A starting worker's first look: stop consuming its paused queues; return them.
    Never raises (a store that does not answer leaves the worker consuming, and says
    so: the next look acts)."""
    try:
        return watch_of(app, str(consumer.hostname), consumer).look()
    except Exception:
        logger.exception("could not read the paused queues: consuming every queue")
        return []


def start(app: Any, consumer: Any) -> list[str]:
    """``worker_ready``: :func:`at_start`, then a look every :data:`WATCH_EVERY` seconds."""
    stopped = at_start(app, consumer)
    watch_of(app, str(consumer.hostname), consumer).start()
    return stopped


def stop(app: Any, hostname: str) -> None:
    """``worker_shutdown``: stop the worker's watch."""
    with _lock:
        found = _watches.pop(hostname, None)
    if found is not None and found.app is app:
        found.stop()
