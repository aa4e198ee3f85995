"""Drain throughput: a queue filled up front, emptied by real worker processes.

Each variant (a convention app, raw Celery, a peer) has its own queue and its own worker,
started once and kept up. Its ``n`` jobs are published before any measuring, by its own
producer process, and held in a side list. The measuring is interleaved: one slice of
``n / rounds`` jobs of each variant in turn (A B C A B C ..., the first one rotating),
each slice moved into the worker's queue at once (one Lua script: the worker sees a full
queue, not a trickle). A slice's rate is the jobs taken after the first ``skip`` over the
time from then to the last completion (the queue empty and no job in flight: kombu's
``unacked`` hash, dramatiq's message hash, rq's started registry). The report gives each
round's ratio between variants and their median.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench import common, proc_cpu, procs
from bench.publisher import Producer
from bench.report import Report, Row

#: KEYS: hold, staging, queue. ARGV: how many. Moves the oldest ``n`` of the hold list
#: into the queue at once (built in a staging list, then renamed: the worker never sees
#: a half-filled queue). Returns how many were moved.
MOVE = """
local n = tonumber(ARGV[1])
local items = redis.call('LRANGE', KEYS[1], -n, -1)
for i = 1, #items, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(items, i, math.min(i + 999, #items)))
end
redis.call('LTRIM', KEYS[1], 0, -(#items + 1))
if #items > 0 then redis.call('RENAME', KEYS[2], KEYS[3]) end
return #items
"""
#: seconds between two looks at a draining queue
POLL = 0.005


@dataclass
class Target:
    """One thing to drain: its queue, its worker, its producer, its in-flight count."""

    name: str
    label: str
    #: the Redis list the worker consumes
    queue: str
    start_worker: Callable[[], procs.Worker]
    #: the ``bench.publisher`` variant and flags that fill it
    producer: str
    producer_flags: tuple[str, ...] = ("--no-hiredis",)
    in_flight: Callable[[Any], int] = lambda client: int(client.hlen("unacked"))
    #: a line of the worker's log that says it is consuming (when it has no ready file)
    ready_marker: bytes | None = None
    worker: procs.Worker | None = field(default=None, repr=False)
    #: the Redis server's pid when it runs here (:func:`bench.proc_cpu.redis_pid`)
    redis_pid: int | None = None
    #: each measured slice's CPU per job by process (:mod:`bench.proc_cpu`)
    cpu: list[dict[str, float]] = field(default_factory=list, repr=False)

    @property
    def hold(self) -> str:
        return f"bench:hold:{self.name}"


def celery_target(name: str, label: str, app: str, queue: str, flags: Sequence[str]) -> Target:
    """A Celery worker ``-P prefork -c 2`` on ``app``, started through ``bench.launch``."""
    launch = tuple(flags)
    return Target(
        name=name,
        label=label,
        queue=queue,
        start_worker=lambda: procs.celery_worker(name, app, queue, launch=launch),
        producer=name,
    )


#: launch flags of each convention variant: what the process-wide options change
CONV_FLAGS = {
    "conv": ("--no-hiredis",),
    "lean": ("--no-hiredis",),
    "conv_orjson": ("--no-hiredis", "--orjson"),
    "conv_hiredis": (),
    "lean_fast": ("--orjson",),
    "tuned": ("--orjson",),
    "raw_tuned": ("--orjson",),
    "quiet": ("--orjson",),
    "quiet_noruns": ("--orjson",),
    "quiet_bare": ("--orjson",),
}
#: what each variant is, in the report
LABELS = {
    "conv": "conventions, reliable profile, Redis store",
    "lean": "conventions + ignore_result, no STARTED state, no sent event",
    "conv_orjson": "conventions + orjson codec",
    "conv_hiredis": "conventions + hiredis",
    "lean_fast": "conventions + lean + orjson + hiredis",
    "tuned": "conventions + lean + orjson + hiredis + prefetch 4",
    "raw": "raw Celery, same reliable settings",
    "raw_tuned": "raw Celery + lean + orjson + hiredis + prefetch 4",
    "quiet": "conventions + tuned + no task events",
    "quiet_noruns": "quiet without run history",
    "quiet_bare": "quiet without run history or the claim's and completion's audit events",
    "default": "raw Celery, its defaults",
}


def target(name: str) -> Target:
    """The drain target called ``name`` (a convention variant, ``raw`` or ``default``)."""
    if name in common.RAW:
        flags = CONV_FLAGS.get(name, ("--no-hiredis",))
        return celery_target(name, LABELS[name], f"bench.apps_raw:{name}", f"bench_{name}", flags)
    return celery_target(
        name, LABELS[name], f"bench.apps:{name}", f"bench_{name}", CONV_FLAGS[name]
    )


def fill(client: Any, targets: Sequence[Target], n: int) -> None:
    """Publish ``n`` jobs of each target with its own producer, into its hold list."""
    for item in targets:
        producer = Producer(item.producer, item.producer_flags)
        try:
            producer.publish(n)
        finally:
            producer.close()
        client.delete(item.hold)
        if client.llen(item.queue) != n:
            raise RuntimeError(f"{item.name}: {client.llen(item.queue)} jobs queued, not {n}")
        client.rename(item.queue, item.hold)


def drain_slice(client: Any, item: Target, n: int, skip: int, timeout: float) -> float:
    """Move ``n`` held jobs into ``item``'s queue; jobs per second after the first ``skip``."""
    mover = client.register_script(MOVE)
    pid = None if item.worker is None else item.worker.proc.pid
    cpu_before = {} if pid is None else proc_cpu.snapshot(pid, item.redis_pid)
    moved_at = time.perf_counter()
    moved = int(mover(keys=[item.hold, f"bench:staging:{item.name}", item.queue], args=[n]))
    started, remaining = moved_at, moved
    counting = False
    deadline = moved_at + timeout
    while True:
        waiting = int(client.llen(item.queue))
        now = time.perf_counter()
        if not counting and waiting <= moved - skip:
            counting = True
            started, remaining = now, waiting
        if waiting == 0 and item.in_flight(client) == 0:
            break
        if now > deadline:
            raise TimeoutError(f"{item.name}: {waiting} jobs still waiting after {timeout:.0f}s")
        time.sleep(POLL)
    elapsed = time.perf_counter() - started
    if pid is not None:
        item.cpu.append(proc_cpu.per_job(cpu_before, proc_cpu.snapshot(pid, item.redis_pid), moved))
    return remaining / elapsed if elapsed > 0 else float("nan")


#: jobs each worker takes before the measuring starts (imports, connections, forks)
WARM = 50
#: the variants whose jobs leave a Celery result behind
STORES_RESULTS = frozenset({"conv", "raw", "conv_orjson", "conv_hiredis"})


def verify(client: Any, names: Sequence[str], jobs: int) -> str:
    """Did every job run through its path? Ledger entries (convention variants) and
    stored results, counted in Redis against what ``jobs`` per variant must leave."""

    def count(pattern: str) -> int:
        return sum(1 for _ in client.scan_iter(match=pattern, count=10_000))

    ledger = sum(jobs for name in names if name not in common.RAW)
    results = sum(jobs for name in names if name in STORES_RESULTS)
    # done entries: a field each in the day buckets (the ledger hashes of an older layout)
    done = sum(int(client.hlen(name)) for name in client.scan_iter(match="cc:done:*"))
    got_ledger, got_results = count("cc:ledger:*") + done, count("celery-task-meta-*")
    verdict = "verified" if (got_ledger, got_results) == (ledger, results) else "MISMATCH"
    return (
        f"{verdict}: {got_ledger:,} ledger entries (expected {ledger:,}), "
        f"{got_results:,} stored results (expected {results:,})"
    )


def run(
    client: Any, targets: Sequence[Target], n: int, rounds: int, *, warm: int = WARM
) -> dict[str, list[float]]:
    """Fill every target, start its worker, then drain it in ``rounds`` interleaved slices;
    every target's rate (jobs/s) per round."""
    fill(client, targets, n + warm)
    try:
        for item in targets:
            item.worker = item.start_worker()
        for item in targets:
            assert item.worker is not None
            item.worker.wait_ready(marker=item.ready_marker)
        redis = proc_cpu.redis_pid(client)
        for item in targets:  # first jobs: imports, connections, forks
            item.redis_pid = redis
            drain_slice(client, item, warm, 0, timeout=120)
            item.cpu.clear()
        size = n // rounds
        skip = max(5, size // 50)
        measure = {
            item.name: partial(drain_slice, client, item, size, skip, size / 5 + 120)
            for item in targets
        }
        rates = common.interleave(measure, rounds)
        problems = [
            f"{item.name}: {line}"
            for item in targets
            if item.worker is not None
            for line in item.worker.errors()[:3]
        ]
        if problems:
            raise RuntimeError("worker errors during the drain:\n" + "\n".join(problems))
        return rates
    finally:
        for item in targets:
            if item.worker is not None:
                item.worker.stop()
                item.worker = None
        for item in targets:
            client.delete(item.hold)


#: the three variants of the main drain, and the options measured against ``conv``
MAIN = ("conv", "raw", "default")
OPTIONS = (
    "conv", "lean", "conv_orjson", "conv_hiredis", "lean_fast", "tuned", "quiet", "raw_tuned",
    "default",
)  # fmt: skip


def ratio_row(section: str, rates: dict[str, list[float]], a: str, b: str, target: str = "") -> Row:
    """``a``'s rate over ``b``'s, round by round, and both medians."""
    value = common.median(common.ratios(rates[a], rates[b]))
    note = (
        f"{LABELS.get(a, a)}: {common.median(rates[a]):,.0f} jobs/s; "
        f"{LABELS.get(b, b)}: {common.median(rates[b]):,.0f} jobs/s"
    )
    return Row(section, f"{a} vs {b} (rate ratio)", value, "x", target, note)


def cpu_rows(
    section: str, targets: Sequence[Target], pairs: Sequence[tuple[str, str]]
) -> list[Row]:
    """Each target's CPU per job (main + pool + Redis, the median of its slices), then
    ``a``'s over ``b``'s, round by round (:mod:`bench.proc_cpu`). Lower is cheaper."""
    by_name = {item.name: item for item in targets if item.cpu}
    rows = []
    for name, item in by_name.items():
        parts = proc_cpu.medians(item.cpu)
        what = f"CPU per job, {name} (worker main + pool + Redis)"
        rows.append(Row(section, what, proc_cpu.total(parts), "us", "", proc_cpu.shown(parts)))
    for a, b in pairs:
        if a in by_name and b in by_name:
            totals = [[proc_cpu.total(s) for s in by_name[name].cpu] for name in (a, b)]
            value = common.median(common.ratios(*totals))
            rows.append(Row(section, f"CPU per job, {a} vs {b} (ratio)", value, "x"))
    return rows


#: what the promises cost a job that keeps no result: ``quiet`` as it is, without run
#: history, without it and the audit events, and raw Celery's defaults
PROMISES = ("quiet", "quiet_noruns", "quiet_bare", "default")


def section(report: Report, client: Any, *, n: int, rounds: int) -> None:
    """The main drain: conventions vs raw Celery (same settings, and its defaults)."""
    client.flushdb()
    targets = [target(name) for name in MAIN]
    rates = run(client, targets, n, rounds)
    report.notes.append(f"drain: {verify(client, MAIN, WARM + n // rounds * rounds)}")
    report.add(ratio_row("drain", rates, "conv", "raw", ">= 0.9"))
    report.add(ratio_row("drain", rates, "conv", "default"))
    report.add(ratio_row("drain", rates, "raw", "default"))
    for row in cpu_rows("drain", targets, [("conv", "raw"), ("raw", "default")]):
        report.add(row)
    report.notes.append(f"drain: {n:,} jobs per variant in {rounds} interleaved slices")
    client.flushdb()


def options_section(report: Report, client: Any, *, n: int, rounds: int) -> None:
    """What recovers the cost: each option's drain rate against the plain layer."""
    client.flushdb()
    targets = [target(name) for name in OPTIONS]
    rates = run(client, targets, n, rounds)
    report.notes.append(f"options: {verify(client, OPTIONS, WARM + n // rounds * rounds)}")
    for name in OPTIONS[1:-2]:  # each option against the plain layer
        report.add(ratio_row("options", rates, name, "conv"))
    report.add(ratio_row("options", rates, "tuned", "raw_tuned", ">= 0.85"))
    report.add(ratio_row("options", rates, "conv", "default"))
    report.add(ratio_row("options", rates, "tuned", "default"))
    report.add(ratio_row("options", rates, "quiet", "default", ">= 1"))
    shown = [item for item in targets if item.name in ("tuned", "raw_tuned", "quiet", "default")]
    for row in cpu_rows("options", shown, [("tuned", "raw_tuned"), ("quiet", "default")]):
        report.add(row)
    report.notes.append(f"options: {n:,} jobs per variant in {rounds} interleaved slices")
    client.flushdb()


def promises_section(report: Report, client: Any, *, n: int, rounds: int) -> None:
    """What run history and the audit trail cost a job that keeps no result (``quiet``),
    and what is left against raw Celery's defaults without them: the ledger's claim and
    completion, late acks, the inbox."""
    client.flushdb()
    targets = [target(name) for name in PROMISES]
    rates = run(client, targets, n, rounds)
    report.notes.append(f"promises: {verify(client, PROMISES, WARM + n // rounds * rounds)}")
    for name in PROMISES[:-1]:
        report.add(ratio_row("promises", rates, name, "default", ">= 1" if name == "quiet" else ""))
    report.add(ratio_row("promises", rates, "quiet_noruns", "quiet"))
    report.add(ratio_row("promises", rates, "quiet_bare", "quiet"))
    pairs = [(name, "default") for name in PROMISES[:-1]]
    for row in cpu_rows("promises", targets, pairs):
        report.add(row)
    report.notes.append(f"promises: {n:,} jobs per variant in {rounds} interleaved slices")
    client.flushdb()
