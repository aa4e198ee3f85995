"""Round-trip latency of one job with a result: ``.delay()`` to ``.get()`` in hand.

A convention worker and a raw Celery worker (both the reliable profile, ``-P prefork -c
2``) are up and idle; each producer process sends one job, waits for its result, and
again, in blocks that alternate between the two. p50 and p99 of each, and the p50
difference (the target: at most 1 ms).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from bench import drain
from bench.publisher import Producer
from bench.report import Report, Row

#: round trips per block (the blocks alternate between the variants)
BLOCK = 10


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run(samples: int, variants: tuple[str, ...] = ("conv", "raw")) -> dict[str, list[float]]:
    """Round-trip seconds of each variant (its worker started here, then stopped)."""
    targets = [drain.target(name) for name in variants]
    workers = [item.start_worker() for item in targets]
    producers: dict[str, Producer] = {}
    try:
        for worker in workers:
            worker.wait_ready()
        producers = {name: Producer(name) for name in variants}
        for producer in producers.values():
            producer.round_trips(BLOCK)  # the result subscription, first forks' imports
        measure = {
            name: partial(producer.round_trips, BLOCK) for name, producer in producers.items()
        }
        blocks: dict[str, list[list[float]]] = {name: [] for name in variants}
        for _ in range(max(1, samples // BLOCK)):
            for name, take in measure.items():
                blocks[name].append(take())
        return {name: [t for block in got for t in block] for name, got in blocks.items()}
    finally:
        for producer in producers.values():
            producer.close()
        for worker in workers:
            worker.stop()


def rows(times: dict[str, list[float]]) -> list[Row]:
    conv, raw = times["conv"], times["raw"]
    ms = {name: (percentile(v, 0.5) * 1e3, percentile(v, 0.99) * 1e3) for name, v in times.items()}
    note = (
        f"conventions p50 {ms['conv'][0]:.2f} ms, p99 {ms['conv'][1]:.2f} ms; raw Celery "
        f"p50 {ms['raw'][0]:.2f} ms, p99 {ms['raw'][1]:.2f} ms; {len(conv)} + {len(raw)} jobs"
    )
    return [
        Row("latency", "p50 round trip overhead, conventions - raw Celery (same settings)",
            ms["conv"][0] - ms["raw"][0], "ms", "<= 1", note),
        Row("latency", "p99 round trip overhead, conventions - raw Celery",
            ms["conv"][1] - ms["raw"][1], "ms"),
        Row("latency", "p50 round trip, conventions", ms["conv"][0], "ms"),
        Row("latency", "p50 round trip, raw Celery", ms["raw"][0], "ms"),
    ]  # fmt: skip


def section(report: Report, client: Any, *, samples: int) -> None:
    client.flushdb()
    for row in rows(run(samples)):
        report.add(row)
    client.flushdb()
