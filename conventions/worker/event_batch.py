"""Task events sent in batches: one ``PUBLISH`` for every job of a short window.

With task events on (the reliable profile, for Flower), Celery's worker buffers each
``task-received``, ``task-started`` and ``task-succeeded`` event and flushes the buffer
at the event loop's next turn: nearly one ``PUBLISH`` per event, 2.4 of a job's 7.9
Redis round trips (``bench/scale.py``). The layer's consumer flushes that buffer once
per ``conventions_event_flush_seconds`` instead (default 0.1 s): every task event of the
window goes in one ``task.multi`` message, which Celery's event receiver (Flower,
``celery events``) reads as the list of events it is. A monitor sees an event at most
that much later; a full buffer (Celery's 24 events) is still flushed at once, and the
consumer flushes what is left before it stops or reconnects. ``0`` keeps Celery's
flush at every turn.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any

logger = logging.getLogger("conventions.worker.event_batch")

#: seconds between two flushes of the buffered task events unless the setting says
DEFAULT_FLUSH_SECONDS = 0.1
#: the setting that sets it
SETTING = "conventions_event_flush_seconds"


def flush_seconds(conf: Any) -> float:
    """``conventions_event_flush_seconds``, or the default; 0 or more."""
    value = conf.get(SETTING)
    seconds = DEFAULT_FLUSH_SECONDS if value is None or value == "" else float(value)
    if seconds < 0:
        raise ValueError(f"{SETTING} = {value!r}: give seconds, 0 or more")
    return seconds


class Batcher:
    """When the consumer's buffered task events are flushed: once per window, from a
    timer of the worker's event loop (the hub)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        #: when the pending flush was asked for (None: none is pending)
        self._asked_at: float | None = None

    def buffered(self, hub: Any, flush: Any) -> None:
        """An event went into the buffer: flush it at the window's end (one timer per
        window); a timer the hub dropped (a reset after a lost connection) is asked for
        again once it is overdue."""
        now = monotonic()
        if self._asked_at is not None and now - self._asked_at < 2 * self.seconds + 1:
            return
        self._asked_at = now
        hub.call_later(self.seconds, self._flush, flush)

    def _flush(self, flush: Any) -> None:
        self._asked_at = None
        flush()

    def flush_now(self, flush: Any) -> None:
        """What the buffer holds, sent now (before the consumer stops or reconnects);
        a failure is logged, never raised (events are for monitors)."""
        try:
            flush()
        except Exception:
            logger.debug("could not flush the buffered task events", exc_info=True)
