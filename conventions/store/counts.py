"""What one audit event counts: the store's counters, kept beside the audit trail.

Every lifecycle step already writes one audit event through the store, in the same round
trip as the state change it records. The store bumps a few integer counters in that same
script or transaction (so counting costs no extra round trip and works from every prefork
child at once); the metrics exporter reads them all in one call (``Store.counters()``).

A counter is named ``<name>|<task>``. The names:

* the event itself: ``published``, ``deduplicated``, ``started``, ``retried``,
  ``deferred``, ``succeeded``, ``skipped``, ``skipped_duplicate``, ``quarantined``,
  ``replayed``, ``watchdog_alarm``...; a dead letter counts as ``dead_lettered:<category>``;
* a histogram of the wait before a start (detail ``wait_s`` of ``started``) and of the
  body's run time (detail ``run_s`` of the outcome events): ``<hist>:<le>`` counts the
  observations in the bucket ``(previous le, le]`` (not cumulative: one field moves per
  observation) and ``<hist>:sum_ms`` their sum in whole milliseconds, so that every
  counter stays an integer (``HINCRBY``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from conventions.store.records import AuditEvent

#: separates the counter's name from the task name (neither may hold it)
SEP: Final = "|"
#: the histogram of the time a job waited in its queue before it started, in seconds
WAIT: Final = "wait_seconds"
#: the histogram of the body's run time, in seconds
RUN: Final = "run_seconds"
#: upper bounds of the histogram buckets, in seconds (the same for both histograms: from a
#: fast e-mail job to a heavy report), then ``+Inf``
BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                  1800.0, 3600.0)  # fmt: skip
#: the event detail that carries each histogram's observation
DETAIL: Final = {WAIT: "wait_s", RUN: "run_s"}
#: the name suffix of a histogram's sum
SUM: Final = "sum_ms"


def _bucket(value: float) -> str:
    """The name of the one bucket an observation falls in."""
    for bound in BUCKETS:
        if value <= bound:
            return repr(bound)
    return "+Inf"


def fields(event: AuditEvent) -> dict[str, int]:
    """The counter fields ``event`` moves, with the amount of each."""
    name = event.event
    if name == "dead_lettered":
        name = f"{name}:{event.detail.get('category') or 'unknown'}"
    task = event.task
    out = {f"{name}{SEP}{task}": 1}
    for hist, detail in DETAIL.items():
        value = event.detail.get(detail)
        if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
            out[f"{hist}:{_bucket(float(value))}{SEP}{task}"] = 1
            out[f"{hist}:{SUM}{SEP}{task}"] = round(float(value) * 1000)
    return out


def split(field_name: str) -> tuple[str, str]:
    """``"started|email.send.v1"`` -> ``("started", "email.send.v1")``."""
    name, _, task = field_name.partition(SEP)
    return name, task


@dataclass
class Histogram:
    """One task's histogram, read back from its counters: cumulative, like Prometheus."""

    #: (upper bound, observations at or below it), the last one ``+Inf``
    buckets: list[tuple[float, int]] = field(default_factory=list)
    #: the sum of the observations, in seconds
    total: float = 0.0

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


def histogram(counters: Mapping[tuple[str, str], int], hist: str, task: str) -> Histogram:
    """The cumulative histogram ``hist`` of ``task`` in ``counters`` (``Store.counters()``)."""
    running = 0
    buckets: list[tuple[float, int]] = []
    for bound in (*(repr(b) for b in BUCKETS), "+Inf"):
        running += counters.get((f"{hist}:{bound}", task), 0)
        buckets.append((float(bound), running))
    return Histogram(buckets, counters.get((f"{hist}:{SUM}", task), 0) / 1000)


def events(counters: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """The event counters alone, dead letters summed over their categories."""
    out: dict[tuple[str, str], int] = {}
    for (name, task), value in counters.items():
        if name.startswith((f"{WAIT}:", f"{RUN}:")):
            continue
        event = name.split(":", 1)[0]
        out[event, task] = out.get((event, task), 0) + value
    return out
