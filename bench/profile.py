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

from bench import common, drain, procs
from bench.publisher import Producer

#: the parts of a job reported, as (label, file suffix, function name)
PARTS: list[tuple[str, str, str]] = [
    (
        "message handled (decode, run, store, events, ack)",
        "celery/worker/consumer/consumer.py",
        "on_task_received",
    ),
    ("  the task run (Celery's trace_task)", "celery/app/trace.py", "trace_task"),
    (
        "    layer: run path (validate, claim, body, complete)",
        "conventions/worker/delivery.py",
        "run",
    ),
    ("      store.claim (1 round trip)", "conventions/store/redis.py", "claim"),
    ("      store.complete (1 round trip)", "conventions/store/redis.py", "complete"),
    ("      payload validation (pydantic)", "conventions/jobs/payloads.py", "parse"),
    ("      audit events built", "conventions/observability/audit.py", "event"),
    ("    layer: prerun hook (context, logs)", "conventions/worker/signals.py", "on_prerun"),
    ("    result backend writes (STARTED, SUCCESS)", "celery/backends/base.py", "store_result"),
    ("  task events sent (received, started, succeeded)", "celery/events/dispatcher.py", "send"),
    ("  message ack (kombu)", "kombu/message.py", "ack"),
    ("JSON dumps (stdlib, everywhere)", "json/__init__.py", "dumps"),
    ("JSON loads (stdlib, everywhere)", "json/__init__.py", "loads"),
    ("redis-py client objects built (kombu makes them)", "redis/client.py", "__init__"),
]


#: the parts of a publish reported, like :data:`PARTS`
PUBLISH_PARTS: list[tuple[str, str, str]] = [
    ("whole .delay()", "celery/app/task.py", "delay"),
    ("  Celery's send_task (message, routing, events)", "celery/app/base.py", "send_task"),
    ("    task-sent event published", "celery/events/dispatcher.py", "publish"),
    ("  layer: store.reserve (1 round trip)", "conventions/store/redis.py", "reserve"),
    ("  layer: payload validation (pydantic)", "conventions/jobs/payloads.py", "parse"),
    ("  layer: headers from the context", "conventions/tracing/context.py", "outgoing"),
    ("  layer: audit event built", "conventions/observability/audit.py", "event"),
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


def summary(stats: pstats.Stats, jobs: int, parts: list[tuple[str, str, str]] = PARTS) -> list[str]:
    """The parts of one job, in microseconds per job (under the profiler)."""
    return [
        f"{label:<52} {cumulative(stats, suffix, name) / jobs * 1e6:8.0f} us/job"
        for label, suffix, name in parts
    ]


def profile_publish(name: str, n: int) -> pstats.Stats:
    """``n`` publishes of variant ``name`` in a profiled producer process."""
    out = procs.run_dir() / f"profile-publish-{name}.pstats"
    out.unlink(missing_ok=True)
    producer = Producer(name, ("--no-hiredis", "--profile", str(out)))
    try:
        producer.publish(n)
    finally:
        producer.close()
    return pstats.Stats(str(out))


def profile(client: Any, name: str, n: int) -> pstats.Stats:
    """Drain ``n`` jobs of variant ``name`` with a profiled ``-P solo`` worker."""
    item = drain.target(name)
    out = procs.run_dir() / f"profile-{name}.pstats"
    out.unlink(missing_ok=True)
    drain.fill(client, [item], n)
    client.rename(item.hold, item.queue)
    flags = drain.CONV_FLAGS.get(name, ("--no-hiredis",))
    app = f"bench.apps_raw:{name}" if name in common.RAW else f"bench.apps:{name}"
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


def side_by_side(results: dict[str, list[str]], parts: list[tuple[str, str, str]]) -> list[str]:
    lines = [f"{'part':<52} " + " ".join(f"{name:>15}" for name in results)]
    for i, (label, _, _) in enumerate(parts):
        cells = [got[i].split()[-2] for got in results.values()]
        lines.append(f"{label:<52} " + " ".join(f"{c:>9} us/job" for c in cells))
    return lines


def section(
    client: Any, n: int, variants: tuple[str, ...] = ("conv", "raw", "default")
) -> list[str]:
    """The profile summary of each variant, side by side per part."""
    client.flushdb()
    worker = {name: summary(profile(client, name, n), n) for name in variants}
    client.flushdb()
    publish = {
        name: summary(profile_publish(name, n), n, PUBLISH_PARTS) for name in ("conv", "raw")
    }
    client.flushdb()
    return [
        *side_by_side(worker, PARTS),
        "",
        "publish side (the producer process):",
        *side_by_side(publish, PUBLISH_PARTS),
    ]
