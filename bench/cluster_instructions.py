"""``python -m bench.scale_cluster --instructions``: the store's cost per job per shard
counted in **instructions** (valgrind's callgrind), which do not depend on how loaded the
machine is, where CPU time does (three ``redis-server`` processes sharing two busy cores
pay for the cache they share, which a machine with a core per master would not).

Each master of the 1-master and the 3-master cluster runs under ``valgrind
--tool=callgrind`` (about 30-50x slower: a few hundred jobs, long timeouts).
``callgrind_control`` zeroes a master's counters and dumps them (a dump zeroes them too):

1. idle: counters zeroed, :data:`IDLE_SECONDS` with nothing talking to the masters, dumped:
   each master's instructions per second of its cron and cluster bus;
2. the run: counters zeroed, one configuration's run of :func:`bench.scale_cluster.child`
   (publish ``N`` jobs, one worker drains them), dumped;
3. the bench's own reads: counters zeroed, :data:`POLLS` reads of the store's counters
   (what the drain polls every second), dumped: their cost per read.

A master's instructions per job are the run's, less its idle rate times the run's seconds
and less the bench's reads, over ``N``. Capacity is inversely proportional to the busiest
shard's figure, so three masters against one is the ratio of the busiest shards'
instructions per job (:func:`ratio`): computed from instruction counts, not wall time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import redis_cluster

#: seconds of the idle count
IDLE_SECONDS = 20.0
#: reads of the store's counters to price one (the drain's poll)
POLLS = 20
#: the clusters measured: (masters, first port)
CLUSTERS = {
    "cluster1": (1, redis_cluster.FIRST_PORT + 10),
    "cluster3": (3, redis_cluster.FIRST_PORT),
}


def valgrind(folder: Path) -> list[str]:
    """The wrapper of each master: callgrind, its files in ``folder`` by port."""
    return [
        "valgrind", "--tool=callgrind", "--dump-line=no", "--compress-strings=no",
        f"--callgrind-out-file={folder}/callgrind.{{port}}.out",
    ]  # fmt: skip


def summary(text: str) -> int:
    """The instructions a callgrind file counted (its ``summary:`` line)."""
    for line in text.splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise ValueError("no summary: line in the callgrind file")


def dump(folder: Path, port: int, pid: int, timeout: float = 120) -> int:
    """The instructions of ``pid`` since its counters were last zeroed (a dump zeroes them)."""
    before = set(folder.glob(f"callgrind.{port}.out.*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in set(folder.glob(f"callgrind.{port}.out.*")) - before:
            text = path.read_text()
            if "\ntotals:" in text:
                return summary(text)
        time.sleep(0.2)
    raise TimeoutError(f"callgrind wrote no dump for :{port} in {timeout:.0f}s")


def zero(pid: int) -> None:
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)


def per_job(
    run: int, *, idle_per_s: float, seconds: float, polls: int, poll: float, jobs: int
) -> float:
    """A master's instructions per job: the run's, less its idle rate over the run's
    seconds and the bench's own reads of the counters."""
    return (run - idle_per_s * seconds - polls * poll) / jobs


def ratio(one: list[float], three: list[float]) -> float:
    """Three masters against one: the capacity is set by the busiest shard."""
    return max(one) / max(three)


def _window(procs: list[tuple[int, int]], folder: Path) -> list[int]:
    return [dump(folder, port, pid) for port, pid in procs]


def _polls(
    store: str, procs: list[tuple[int, int]], folder: Path, idle: list[float]
) -> list[float]:
    """Each master's instructions per read of the store's counters (idle taken out)."""
    from conventions.store.redis import RedisStore

    reader = RedisStore(store)
    reader.counters()
    for _, pid in procs:
        zero(pid)
    t0 = time.monotonic()
    for _ in range(POLLS):
        reader.counters()
    seconds = time.monotonic() - t0
    found = _window(procs, folder)
    return [max(0.0, (n - rate * seconds) / POLLS) for n, rate in zip(found, idle, strict=True)]


def one_cluster(name: str, jobs: int, variant: str, folder: Path) -> dict[str, Any]:
    """One cluster under callgrind: its idle rate, the run, the reads; per job per shard."""
    from bench import scale_cluster

    masters, first = CLUSTERS[name]
    with redis_cluster.started(masters, first, valgrind(folder)) as procs:
        ports = [port for port, _ in procs]
        for _, pid in procs:
            zero(pid)
        t0 = time.monotonic()
        time.sleep(IDLE_SECONDS)
        idle_counts = _window(procs, folder)
        idle = [n / (time.monotonic() - t0) for n in idle_counts]
        for _, pid in procs:
            zero(pid)
        t0 = time.monotonic()
        child = scale_cluster._spawn(redis_cluster.url(ports), ports, jobs, variant)
        counted = _window(procs, folder)
        seconds = time.monotonic() - t0
        poll = _polls(redis_cluster.url(ports), procs, folder, idle)
    shards = [per_job(n, idle_per_s=rate, seconds=seconds, polls=child["polls"], poll=p, jobs=jobs)
              for n, rate, p in zip(counted, idle, poll, strict=True)]  # fmt: skip
    return {
        "ports": ports,
        "partitions": scale_cluster.partitions(ports),
        "seconds": round(seconds, 1),
        "idle_per_s": [round(x) for x in idle],
        "run": counted,
        "polls": child["polls"],
        "per_poll": [round(x) for x in poll],
        "per_job": [round(x) for x in shards],
        "commands_per_job": [
            round(sum(p["shard_commands"][i] for p in child["phases"]), 1)
            for i in range(len(ports))
        ],
        "keys": child["keys"],
    }


def measure(jobs: int, variant: str) -> dict[str, Any]:
    """Both clusters (the broker one plain Redis of the run's own), in turn."""
    from bench.idle import own_redis

    folder = Path(tempfile.mkdtemp(prefix="cc-bench-callgrind-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        broker = stack.enter_context(own_redis())
        port = broker.connection_pool.connection_kwargs["port"]
        os.environ["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        out = {}
        for name in CLUSTERS:
            print(f"# instructions: {name}", file=sys.stderr, flush=True)
            out[name] = one_cluster(name, jobs, variant, folder)
    three = ratio(out["cluster1"]["per_job"], out["cluster3"]["per_job"])
    return {"jobs": jobs, "variant": variant, "configs": out, "three_over_one": round(three, 2)}
