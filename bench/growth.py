"""Cost growth with queue length: publish, drain and the queues view with a backlog.

The backlog is ``size`` jobs waiting in the *same* queue the measured jobs go to (not
another one): kombu publishes with ``LPUSH`` and workers take with ``BRPOP``, both O(1),
and the layer never reads the queue on the per-job path, so a cost that grew with the
backlog would be ours or a surprise in kombu, and this is where it would show. For the
drain the measured jobs are the oldest (taken first) and the backlog waits behind them:
the worker works with ``size`` more jobs in its queue; the backlog is dropped once the
measured jobs are taken. Backlog jobs are copies of one real message with their own task
id, delivery tag and idempotency key, built once and copied into place (``COPY``) each
round. Every arm is interleaved with the same arm without a backlog; the ratio is
backlog rate / empty rate (1.0: no growth).
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench import common, drain
from bench.publisher import Producer
from bench.report import Report, Row

#: where the backlog is kept between rounds
BACKLOG = "bench:backlog"
#: the target of every growth ratio (rate with the backlog / rate without)
TARGET = ">= 0.8"


def build_backlog(client: Any, template: str, size: int, batch: int = 1000) -> None:
    """``size`` distinct copies of the real message ``template`` in :data:`BACKLOG`."""
    message = json.loads(template)
    task_id = message["headers"]["id"]
    tag = message["properties"]["delivery_tag"]
    key = message["headers"]["cc_idempotency_key"]
    client.delete(BACKLOG)
    for start in range(0, size, batch):
        items = [
            template.replace(task_id, f"backlog-{i:027d}")
            .replace(tag, f"tag-{i:032d}")
            .replace(key, f"noop:backlog_{i}")
            for i in range(start, min(size, start + batch))
        ]
        client.lpush(BACKLOG, *items)


def template_message(client: Any, queue: str) -> str:
    """One real message of the convention variant, published by its own producer."""
    producer = Producer("conv")
    try:
        producer.publish(1)
    finally:
        producer.close()
    message = client.rpop(queue)
    return message.decode() if isinstance(message, bytes) else str(message)


def publish_arms(client: Any, queue: str, n: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per convention publish into an empty queue and into one with the backlog."""
    producer = Producer("conv")
    try:
        producer.publish(50)

        def arm(backlog: bool) -> float:
            client.delete(queue)
            if backlog:
                client.copy(BACKLOG, queue)
            spent = producer.publish(n) / n
            client.unlink(queue)
            return spent

        measure = {"empty": lambda: arm(False), "backlog": lambda: arm(True)}
        return common.interleave(measure, rounds)
    finally:
        producer.close()


def drain_with_backlog(client: Any, item: drain.Target, n: int, size: int, skip: int) -> float:
    """Jobs/s over ``n`` held jobs taken from a queue where ``size`` more wait behind them."""
    staging = f"bench:staging:{item.name}"
    client.delete(staging)
    if size:
        client.copy(BACKLOG, staging)
    moved = client.lrange(item.hold, -n, -1)
    client.ltrim(item.hold, 0, -(len(moved) + 1))
    for start in range(0, len(moved), 1000):
        client.rpush(staging, *moved[start : start + 1000])
    client.rename(staging, item.queue)
    started, remaining, counting = time.perf_counter(), len(moved), False
    deadline = started + n / 5 + 120
    while True:
        left = int(client.llen(item.queue)) - size
        now = time.perf_counter()
        if not counting and left <= len(moved) - skip:
            counting, started, remaining = True, now, max(left, 0)
        if left <= 0:
            break
        if now > deadline:
            raise TimeoutError(f"growth drain: {left} measured jobs still waiting")
        time.sleep(drain.POLL)
    elapsed = time.perf_counter() - started
    client.unlink(item.queue)  # the backlog: never meant to run
    while item.in_flight(client):
        time.sleep(drain.POLL)
    return remaining / elapsed if elapsed > 0 else float("nan")


def drain_arms(client: Any, n: int, size: int, rounds: int) -> dict[str, list[float]]:
    """Convention drain rates, interleaved: ``n`` jobs alone, and with ``size`` behind."""
    item = drain.target("conv")
    drain.fill(client, [item], n * rounds * 2 + 50)
    item.worker = item.start_worker()
    try:
        item.worker.wait_ready()
        drain.drain_slice(client, item, 50, 0, timeout=120)
        skip = max(5, n // 50)
        measure = {
            "empty": lambda: drain_with_backlog(client, item, n, 0, skip),
            "backlog": lambda: drain_with_backlog(client, item, n, size, skip),
        }
        return common.interleave(measure, rounds)
    finally:
        item.worker.stop()
        item.worker = None
        client.delete(item.hold)


def queues_arms(client: Any, queue: str, rounds: int, reads: int = 200) -> dict[str, list[float]]:
    """Seconds per read of the queues view (``conventions.observability.queues``) with one
    job waiting and with the backlog.

    The baseline is one job, not an empty queue: the view parses the head message of a
    queue that has one (the oldest job's age), a constant an empty queue skips. What is
    asked here is whether the read grows with the backlog."""
    from bench import apps
    from conventions.observability import queues

    view = queues.from_app(apps.conv, client)

    def arm(backlog: bool) -> float:
        client.delete(queue)
        if backlog:
            client.copy(BACKLOG, queue)
        else:
            client.rpush(queue, client.lindex(BACKLOG, -1))
        start = time.perf_counter()
        for _ in range(reads):
            view.read()
        spent = (time.perf_counter() - start) / reads
        client.unlink(queue)
        return spent

    return common.interleave({"one": lambda: arm(False), "backlog": lambda: arm(True)}, rounds)


def ratio_row(
    what: str, times: dict[str, list[float]], *, rates: bool, unit: str, base: str = "empty"
) -> Row:
    """backlog vs ``base`` (an empty queue, or one job) as a rate ratio (1.0: the backlog
    costs nothing)."""
    if rates:
        value = common.median(common.ratios(times["backlog"], times[base]))
    else:
        value = common.median(common.ratios(times[base], times["backlog"]))
    scale = 1.0 if rates else 1e6
    note = (
        f"{base} {common.median(times[base]) * scale:,.0f} {unit}, "
        f"backlog {common.median(times['backlog']) * scale:,.0f} {unit}"
    )
    return Row("growth", what, value, "x", TARGET, note)


def section(report: Report, client: Any, *, size: int, n: int, rounds: int) -> None:
    """Publish, drain and the queues view, each with and without ``size`` waiting jobs."""
    client.flushdb()
    queue = "bench_conv"
    build_backlog(client, template_message(client, queue), size)
    label = f"{size:,} jobs waiting in the same queue"
    times = publish_arms(client, queue, n, rounds)
    report.add(ratio_row(f"publish, {label} (rate ratio)", times, rates=False, unit="us"))
    times = drain_arms(client, n, size, rounds)
    report.add(ratio_row(f"drain, {label} (rate ratio)", times, rates=True, unit="jobs/s"))
    view = queues_arms(client, queue, rounds)
    report.add(
        ratio_row(f"queues view read, {label} vs one", view, rates=False, unit="us", base="one")
    )
    client.flushdb()
