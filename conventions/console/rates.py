"""The rates of the queues page: jobs published into each queue and finished out of it,
per second, between two readings of the store's counters (as ``conventions queues
--watch`` computes them). The first reading has no rate."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from conventions.ops import exporter
from conventions.store import counts

#: the events that take a job out of its queue's work for good (the "out" rate)
FINISHED = ("succeeded", "skipped", "skipped_duplicate", "dead_lettered")
Flows = dict[str, tuple[int, int]]


def flows(app: Any) -> Flows:
    """Per queue: (jobs published into it, jobs finished out of it), all time."""
    task_queues = exporter.queue_of_tasks(app)
    out: Flows = {}
    for (event, task), value in counts.events(app.store.counters()).items():
        queue = task_queues.get(task)
        if queue is None or (event != "published" and event not in FINISHED):
            continue
        into, done = out.get(queue, (0, 0))
        out[queue] = (into + value, done) if event == "published" else (into, done + value)
    return out


@dataclass
class Rates:
    """The last reading, shared by every page of one console."""

    last: tuple[float, Flows] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, app: Any) -> dict[str, tuple[float, float]]:
        """Per queue: (in per second, out per second) since the previous sample."""
        now, current = time.monotonic(), flows(app)
        with self.lock:
            before, self.last = self.last, (now, current)
        if before is None or now <= before[0]:
            return {}
        elapsed = now - before[0]
        out = {}
        for queue, (into, done) in current.items():
            was_in, was_done = before[1].get(queue, (0, 0))
            out[queue] = ((into - was_in) / elapsed, (done - was_done) / elapsed)
        return out
