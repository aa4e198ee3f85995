"""Where a Celery job's time goes: the worker under cProfile, convention and raw.

``n`` jobs of each variant are drained by one ``-P solo`` worker (one process receives,
runs, stores and acks, so one profile holds the whole job) run under cProfile by
:mod:`bench.launch`. The summary gives the cumulative time per job of the parts that
matter (the layer's run path, Celery's result writes and events, kombu's receive and
ack, JSON, redis-py), measured under the profiler: read them as shares, not as times.
"""

from __future__ import annotations

import pstats
import time
from pathlib import Path
from typing import Any

from bench import drain, procs

#: the parts of a job reported, as (label, file suffix, function name)
PARTS: list[tuple[str, str, str]] = [
    (
        "message handled (decode, run, store, events, ack)",
        "celery/worker/consumer/consumer.py",
        "on_task_received",
    ),
    ("  the task run (Celery's trace_task)", "celery/app/trace.py", "trace_task"),
    ("    layer: run path (validate, claim, body, complete)", "conventions/runner.py", "run"),
    ("      store.claim (1 round trip)", "conventions/store/redis.py", "claim"),
    ("      store.complete (1 round trip)", "conventions/store/redis.py", "complete"),
    ("      payload validation (pydantic)", "conventions/payloads.py", "parse"),
    ("      audit events built", "conventions/audit.py", "event"),
    ("    layer: prerun hook (context, logs)", "conventions/tracing.py", "on_prerun"),
    ("    result backend writes (STARTED, SUCCESS)", "celery/backends/base.py", "store_result"),
    ("  task events sent (received, started, succeeded)", "celery/events/dispatcher.py", "send"),
    ("  message ack (kombu)", "kombu/message.py", "ack"),
    ("JSON dumps (stdlib, everywhere)", "json/__init__.py", "dumps"),
    ("JSON loads (stdlib, everywhere)", "json/__init__.py", "loads"),
    ("redis-py client objects built (kombu makes them)", "redis/client.py", "__init__"),
]


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """Cumulative seconds of every function ``name`` in a file ending with ``suffix``."""
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    return sum(
        float(entry[3])
        for (filename, _, function), entry in table.items()
        if function == name and filename.endswith(suffix)
    )


def summary(stats: pstats.Stats, jobs: int) -> list[str]:
    """The parts of one job, in microseconds per job (under the profiler)."""
    return [
        f"{label:<52} {cumulative(stats, suffix, name) / jobs * 1e6:8.0f} us/job"
        for label, suffix, name in PARTS
    ]


def profile(client: Any, name: str, n: int) -> pstats.Stats:
    """Drain ``n`` jobs of variant ``name`` with a profiled ``-P solo`` worker."""
    item = drain.target(name)
    out = procs.LOG_DIR / f"profile-{name}.pstats"
    out.unlink(missing_ok=True)
    drain.fill(client, [item], n)
    client.rename(item.hold, item.queue)
    flags = drain.CONV_FLAGS.get(name, ("--no-hiredis",))
    app = f"bench.apps_raw:{name}" if name in ("raw", "default") else f"bench.apps:{name}"
    worker = procs.celery_worker(
        f"profile-{name}", app, item.queue, pool="solo", concurrency=1,
        launch=(*flags, "--profile", str(out)),
    )  # fmt: skip
    try:
        worker.wait_ready()
        deadline = time.monotonic() + n / 5 + 120
        while client.llen(item.queue) or item.in_flight(client):
            if time.monotonic() > deadline:
                raise TimeoutError(f"profile {name}: the queue did not drain")
            time.sleep(0.05)
    finally:
        worker.stop()
    return pstats.Stats(str(Path(out)))


def section(
    client: Any, n: int, variants: tuple[str, ...] = ("conv", "raw", "default")
) -> list[str]:
    """The profile summary of each variant, side by side per part."""
    client.flushdb()
    results = {name: summary(profile(client, name, n), n) for name in variants}
    client.flushdb()
    lines = [f"{'part':<52} " + " ".join(f"{name:>15}" for name in variants)]
    for i, (label, _, _) in enumerate(PARTS):
        cells = [results[name][i].split()[-2] for name in variants]
        lines.append(f"{label:<52} " + " ".join(f"{c:>9} us/job" for c in cells))
    return lines
