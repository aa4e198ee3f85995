"""The sampler of the console's charts: once a minute, each queue's totals and oldest age
into the store's per-minute series (:mod:`conventions.store.series`).

The totals come from the store's counters (one read: what every audit event already
moved), summed per queue over the queue's tasks; the oldest age from the broker (the
same reading as the queues page). Whoever reads those anyway calls :func:`sample`: the
console's queues page (and its live refresh) and the watchdog (every minute, from beat,
so the series goes on while nobody looks). A minute already sampled is left alone, so
any number of callers write it about once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from conventions.observability import queues as queuelib
from conventions.ops import exporter
from conventions.ops.transport_view import broker_reader
from conventions.store import counts, series

logger = logging.getLogger("conventions.ops.sampler")

#: audit event -> the total of a sample it counts into
EVENTS: Mapping[str, str] = {
    "published": "published",
    "succeeded": "succeeded",
    "skipped": "succeeded",
    "skipped_duplicate": "succeeded",
    "dead_lettered": "failed",
    "retried": "retried",
}

_last: dict[int, datetime] = {}
_lock = threading.Lock()


def totals(app: Any, counters: Mapping[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    """Per queue: the cumulative totals of :data:`conventions.store.series.TOTALS`."""
    task_queues = exporter.queue_of_tasks(app)
    out = {queue: dict.fromkeys(series.TOTALS, 0) for queue in queuelib.queue_names(app)}
    for (event, task), value in counts.events(counters).items():
        queue, total = task_queues.get(task), EVENTS.get(event)
        if queue is None or total is None:
            continue
        row = out.setdefault(queue, dict.fromkeys(series.TOTALS, 0))
        row[total] += value
    return out


def oldest_ages(app: Any) -> dict[str, float | None]:
    """Each queue's oldest waiting age from the broker (no consumers asked)."""
    reader = broker_reader(app)
    try:
        return {state.queue: state.oldest_age for state in reader.read(None)}
    finally:
        reader.close()


def sample(
    app: Any,
    *,
    ages: Mapping[str, float | None] | None = None,
    now: datetime | None = None,
) -> bool:
    """Record this minute's sample unless it is recorded already; True when written.

    ``ages``: the oldest ages the caller has just read (else read here). Never raises:
    a chart with a gap is better than a page or a watchdog that fails for it."""
    at = series.minute(now or datetime.now(UTC))
    store = app.store
    with _lock:
        if _last.get(id(store)) == at:
            return False
        _last[id(store)] = at
    try:
        if series.has(store, at):
            return False
        found = dict(ages) if ages is not None else oldest_ages(app)
        rows: dict[str, dict[str, Any]] = dict(totals(app, store.counters()))
        for queue, age in found.items():
            rows.setdefault(queue, dict.fromkeys(series.TOTALS, 0))[series.OLDEST] = age
        series.record(store, at, rows)
        return True
    except Exception:
        logger.warning("could not record the queues' sample of %s", at, exc_info=True)
        return False
