"""Cost growth with store size: the per-job store calls, dead-letter listing and replay.

Two Redis stores side by side on the benchmark database, told apart by their key prefix:
``small`` holds 20 dead letters of the benchmark task and 100 of another task (with 100
finished ledger entries), ``big`` the same 20 and ``size`` of the other task (and ``size``
ledger entries), written through the store API
(``RedisStore`` on a pipeline: the same scripts, sent in batches). Each operation is
timed on both, interleaved, and reported as big / small rate (1.0: no growth):

- the per-job path: ``reserve`` + ``claim`` + ``complete`` of a fresh key;
- ``list_dead_letters(limit=50)`` (``conventions dlq list``), unfiltered and by task;
- ``replay`` of one dead letter by id, and ``replay_many`` of a task's 20 records.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import redis

from bench import common
from bench.report import Report, Row

#: the dead letters the replays work on, in both stores
OWN = 20
#: the task of the ``size`` other records of the big store
OTHER_TASK = "bench.other_task.v1"


def dead_letter(i: int, task: str, prefix: str) -> Any:
    """A realistic dead-letter record (a payload, headers, a short traceback)."""
    from conventions.store.records import Category, DeadLetter, utcnow

    now = utcnow() - timedelta(seconds=i)
    return DeadLetter(
        id=f"{prefix}{task}:{i}",
        task=task,
        task_id=str(uuid.uuid4()),
        category=Category.PERMANENT,
        payload={"order_id": f"ord_{prefix}{i}"},
        headers={"cc_correlation": uuid.uuid4().hex},
        idempotency_key=f"noop:ord_{prefix}{i}",
        exc_type="PermanentError",
        message=f"unknown order ord_{i}",
        traceback='Traceback (most recent call last):\n  File "x.py", line 1\nPermanentError',
        attempts=1,
        first_failed_at=now,
        last_failed_at=now,
        worker="bench@host",
        queue="bench_conv",
        correlation_id=uuid.uuid4().hex,
    )


def fill(client: redis.Redis, prefix: str, count: int, task: str, ledger: int = 0) -> None:
    """``count`` dead letters of ``task`` and ``ledger`` done entries, in batches."""
    from conventions.store import RedisStore

    for start in range(0, max(count, ledger), 1000):
        pipe = client.pipeline(transaction=False)
        store = RedisStore(pipe, prefix=prefix)
        for i in range(start, min(count, start + 1000)):
            store.put_dead_letter(dead_letter(i, task, prefix))
        for i in range(start, min(ledger, start + 1000)):
            store.complete(f"done:{i}", "owner", "succeeded", 86400.0, None)
        pipe.execute()


def per_job(store: Any, n: int) -> float:
    """Seconds per reserve + claim + complete of a fresh key (the store's per-job calls)."""
    keys = [f"job:{uuid.uuid4().hex}" for _ in range(n)]
    start = time.perf_counter()
    for key in keys:
        store.reserve(key, key, 3600.0)
        store.claim(key, "owner", 30.0, key)
        store.complete(key, "owner", "succeeded", 3600.0, key)
    return (time.perf_counter() - start) / n


def timed(action: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        action()
    return (time.perf_counter() - start) / repeat


def replays(app: Any, store: Any, prefix: str, task: str) -> float:
    """Seconds for a ``replay`` of one of the store's own records (unmarked again after)."""
    from conventions.ops.replay import replay

    app.__dict__["_cc_store"] = store  # the app's store, swapped for this arm
    record = store.get_dead_letter(f"{prefix}{task}:0")
    start = time.perf_counter()
    replay(app, record.id, reason="bench", actor="bench", force=True)
    spent = time.perf_counter() - start
    store.client.delete(f"{store.prefix}dedup:{record.idempotency_key}")
    store.put_dead_letter(record)  # unmarked again
    return spent


def replay_all(app: Any, store: Any, prefix: str, task: str) -> float:
    """Seconds for ``replay_many`` of the task's :data:`OWN` records (put back after)."""
    from conventions.ops.replay import replay_many

    app.__dict__["_cc_store"] = store
    start = time.perf_counter()
    outcomes = replay_many(app, task=task, reason="bench", actor="bench")
    spent = time.perf_counter() - start
    if len(outcomes) != OWN:
        raise RuntimeError(f"replay_many replayed {len(outcomes)} records, not {OWN}")
    fill(store.client, prefix, OWN, task)  # unmarked again for the next round
    store.client.delete(*store.client.keys(f"{store.prefix}dedup:*") or ["none"])
    return spent


def section(report: Report, client: Any, *, size: int, n: int, rounds: int) -> None:
    from bench import apps
    from conventions.store import RedisStore

    client.flushdb()
    text = redis.Redis.from_url(common.url(), decode_responses=True)
    app, task = apps.conv, apps.task_name("conv")
    stores = {"small": RedisStore(text, prefix="bsmall:"), "big": RedisStore(text, prefix="bbig:")}
    for store in stores.values():
        fill(text, store.prefix, OWN, task)
    fill(text, "bsmall:", 100, OTHER_TASK, ledger=100)  # both lists return 50 records
    fill(text, "bbig:", size, OTHER_TASK, ledger=size)
    original = app.__dict__.get("_cc_store")
    label = f"{size:,} dead letters + {size:,} ledger entries"
    checks: list[tuple[str, Callable[[Any, str], float]]] = [
        ("per-job store calls (reserve, claim, complete)", lambda s, p: per_job(s, n)),
        ("dead-letter list, newest 50",
         lambda s, p: timed(lambda: s.list_dead_letters(limit=50), 20)),
        ("dead-letter list by task, 50",
         lambda s, p: timed(lambda: s.list_dead_letters(task=task, limit=50), 20)),
        ("replay one dead letter by id", lambda s, p: replays(app, s, p, task)),
        (f"replay_many of a task's {OWN} records", lambda s, p: replay_all(app, s, p, task)),
    ]  # fmt: skip
    try:
        for what, check in checks:
            measure = {name: partial(check, store, store.prefix) for name, store in stores.items()}
            times = common.interleave(measure, rounds)
            value = common.median(common.ratios(times["small"], times["big"]))
            note = (
                f"small {common.median(times['small']) * 1e3:.3f} ms, "
                f"big {common.median(times['big']) * 1e3:.3f} ms"
            )
            report.add(Row("growth", f"{what}, {label} (rate ratio)", value, "x", ">= 0.8", note))
    finally:
        if original is not None:
            app.__dict__["_cc_store"] = original
        else:
            app.__dict__.pop("_cc_store", None)
        text.close()
        client.flushdb()
