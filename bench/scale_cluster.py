"""``python -m bench.scale_cluster [--jobs N] [--rounds R] [--out FILE]``: the store on
Redis Cluster, Redis CPU per job **per shard**, one master against three.

The broker stays one ``redis-server`` of this run's own (as in :mod:`bench.scale`); the
*store* is, in turn: a plain Redis of its own (``store``: the layout without hash tags),
a one-master Redis Cluster (``cluster1``) and a three-master one (``cluster3``), both of
this run's own (:mod:`bench.redis_cluster`: ports 7200-7202 and 7210, no replicas, no
persistence). Each configuration publishes ``N`` jobs of the reliable profile (``conv``)
with no worker up, then one prefork worker (``-c 2``) drains them, in a process of its own
(the apps read the store URL at import); the configurations take turns, round after
round, and a figure is the median of its rounds.

Around each phase, every master's ``INFO cpu`` and ``INFO commandstats`` are read: the
CPU and the commands each shard spent, per job of the whole run. After the run phase, the
keys each master holds and the partitions (of the 64 of :mod:`conventions.store.keys`)
its slots hold: the spread. The capacity follows: at 70% of a core on the busiest shard,
``700,000 / (its CPU per job)`` jobs/s; three masters against one is the ratio of those
(the goal: at least 2.5x). On a two-core machine the wall-clock jobs/s is the workers'
(they share the cores with every server), so it is kept, but the capacity is computed
from the CPU per job per shard, and said so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import common, procs, redis_cluster, results, scale_run

#: the jobs per measured phase unless ``--jobs`` says otherwise
DEFAULT_JOBS = 2000
DEFAULT_ROUNDS = 2
#: the share of one core a shard is planned to (as :data:`bench.tables.PLANNED`)
PLANNED = 0.7
#: what the store is, in the order of the tables
CONFIGS = ("store", "cluster1", "cluster3")
#: commands the bench sends itself (its drain poll, its counter reads): not the job's
OWN = {"info", "hgetall", "cluster", "ping", "flushall", "dbsize", "config"}


def _cpu_and_calls(node: redis.Redis) -> tuple[float, int]:
    cpu = node.info("cpu")
    stats = node.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items()
                if k.removeprefix("cmdstat_").split("|")[0] not in OWN)  # fmt: skip
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


class ShardMeter:
    """Every master's (and the broker's) CPU and commands before a phase."""

    def __init__(self, broker: redis.Redis, nodes: list[redis.Redis]) -> None:
        self.broker, self.nodes = broker, nodes
        self.start = [_cpu_and_calls(n) for n in [broker, *nodes]]
        self.t0 = time.monotonic()

    def done(self, phase: str, jobs: int) -> dict[str, Any]:
        seconds = time.monotonic() - self.t0
        now = [_cpu_and_calls(n) for n in [self.broker, *self.nodes]]
        per = [((c1 - c0) / jobs * 1e6, (n1 - n0) / jobs)
               for (c0, n0), (c1, n1) in zip(self.start, now, strict=True)]  # fmt: skip
        return {
            "phase": phase,
            "seconds": round(seconds, 2),
            "jobs_per_s": round(jobs / seconds, 1),
            "broker_cpu_us": round(per[0][0], 1),
            "shard_cpu_us": [round(cpu, 1) for cpu, _ in per[1:]],
            "shard_commands": [round(n, 2) for _, n in per[1:]],
        }


def idle_cpu(nodes: list[redis.Redis], seconds: float = 5.0) -> list[float]:
    """Each master's CPU while nothing talks to it (cron, the cluster bus), µs per s."""
    before = [_cpu_and_calls(n)[0] for n in nodes]
    time.sleep(seconds)
    return [
        round((_cpu_and_calls(n)[0] - b) / seconds * 1e6, 1)
        for n, b in zip(nodes, before, strict=True)
    ]


def partitions(ports: list[int]) -> list[int]:
    """How many of the 64 partitions each master's slots hold (all of them on one node)."""
    from conventions.store import keys

    if len(ports) == 1:
        return [keys.CLUSTER_PARTITIONS]
    bounds = redis_cluster.ranges(len(ports))
    held = [0] * len(ports)
    for tag in keys.PARTITION_TAGS:
        slot = keys.crc16(tag.encode()) % redis_cluster.SLOTS
        held[next(i for i, (lo, hi) in enumerate(bounds) if lo <= slot <= hi)] += 1
    return held


def _worker(env: dict[str, str], variant: str, app: str) -> procs.Worker:
    name = f"scale_cluster_{variant}"
    ready = procs.run_dir() / f"{name}.ready"
    argv = [
        common.python(), "-m", "bench.launch", "--no-hiredis", "--ready", str(ready), "--",
        "-A", app, "worker", "-P", "prefork", "-c", "2", "-Q", f"bench_{variant}",
        "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=WARNING",
    ]  # fmt: skip
    return procs.Worker(name, argv, ready, env=env)


def _drained(store: str, jobs: int, timeout: float = 600) -> int:
    """Until the store's succeeded counters (every partition's, summed) reach ``jobs``;
    how many times they were read (a read is the bench's cost, not the jobs')."""
    from conventions.store import counts
    from conventions.store.redis import RedisStore

    reader = RedisStore(store)
    deadline = time.monotonic() + timeout
    polls = 0
    while time.monotonic() < deadline:
        found = counts.events(reader.counters())
        polls += 1
        if sum(n for (event, _), n in found.items() if event == "succeeded") >= jobs:
            return polls
        time.sleep(1.0)
    raise TimeoutError(f"{jobs} jobs not drained in {timeout:.0f}s")


def child(store: str, ports: list[int], jobs: int, variant: str) -> dict[str, Any]:
    """One configuration's phases, in this process (``--child``)."""
    env = common.env()
    env["CONVENTIONS_STORE_URL"] = store
    # the bench's cluster has no replicas (their cost is not what is measured): lowered,
    # as the persistence check is for every bench run
    env["CONVENTIONS_DOCTOR_LEVELS"] += ",cluster-master-without-replica=warning"
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    broker = redis.Redis.from_url(common.url())
    nodes = [redis.Redis(port=port) for port in ports]
    broker.flushdb()
    for node in nodes:
        node.flushall()
    idle = idle_cpu(nodes)
    delay, app = scale_run._task(variant)  # imports the apps: after the environment
    delay("warm")
    meter = ShardMeter(broker, nodes)
    for n in range(jobs):
        delay(f"o{n}")
    published = meter.done("publish", jobs)
    worker = _worker(env, variant, app)
    try:
        meter = ShardMeter(broker, nodes)
        worker.wait_ready()
        polls = _drained(store, jobs + 1)
        ran = meter.done("run", jobs)
    finally:
        worker.stop()
    if worker.errors():
        raise RuntimeError("the worker logged errors:\n" + "\n".join(worker.errors()[:20]))
    return {
        "phases": [published, ran],
        "idle_cpu_us_per_s": idle,
        "keys": [int(node.dbsize()) for node in nodes],
        "jobs": jobs,
        "polls": polls,
    }


def _spawn(store: str, ports: list[int], jobs: int, variant: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.scale_cluster", "--child", store,
            "--ports", ",".join(map(str, ports)), "--jobs", str(jobs),
            "--variant", variant]  # fmt: skip
    out = subprocess.run(argv, cwd=common.ROOT, env=common.env(), capture_output=True,
                         text=True, check=False)  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"bench.scale_cluster --child {store} failed:\n{out.stderr[-4000:]}")
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def _median_runs(runs: list[dict[str, Any]], ports: list[int]) -> dict[str, Any]:
    """The medians of the rounds, per phase and per shard; the per-round whole-job CPU of
    the busiest shard (what the capacity is computed from)."""

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    phases = []
    for n, first in enumerate(runs[0]["phases"]):
        every = [run["phases"][n] for run in runs]
        phases.append({
            "phase": first["phase"],
            "seconds": med([p["seconds"] for p in every]),
            "jobs_per_s": med([p["jobs_per_s"] for p in every]),
            "broker_cpu_us": med([p["broker_cpu_us"] for p in every]),
            "shard_cpu_us": [med([p["shard_cpu_us"][i] for p in every])
                             for i in range(len(ports))],
            "shard_commands": [med([p["shard_commands"][i] for p in every])
                               for i in range(len(ports))],
        })  # fmt: skip
    busiest = [max(sum(p["shard_cpu_us"][i] for p in run["phases"]) for i in range(len(ports)))
               for run in runs]  # fmt: skip
    net = [max(_net(run, i) for i in range(len(ports))) for run in runs]
    return {
        "ports": ports,
        "partitions": partitions(ports),
        "phases": phases,
        "keys": runs[0]["keys"],
        "idle_cpu_us_per_s": runs[0]["idle_cpu_us_per_s"],
        "busiest_cpu_us_rounds": [round(b, 1) for b in busiest],
        "busiest_cpu_us": med(busiest),
        "busiest_net_cpu_us_rounds": [round(b, 1) for b in net],
        "busiest_net_cpu_us": med(net),
        "capacity_jobs_s": round(PLANNED * 1e6 / statistics.median(net)),
    }


def _net(run: dict[str, Any], shard: int) -> float:
    """A shard's CPU per job of a whole job without what it spends idle (its cron and
    cluster bus, measured before the run: a cost per second, not per job)."""
    idle = run["idle_cpu_us_per_s"][shard]
    return float(sum(p["shard_cpu_us"][shard] - idle * p["seconds"] / run["jobs"]
                     for p in run["phases"]))  # fmt: skip


def measure(jobs: int, rounds: int, variant: str) -> dict[str, Any]:
    """Every configuration's runs, in turn, ``rounds`` times; their medians."""
    from bench.idle import own_redis

    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(own_redis())
        os.environ["BENCH_REDIS_URL"] = (
            f"redis://127.0.0.1:{broker.connection_pool.connection_kwargs['port']}/0"
        )
        alone = stack.enter_context(own_redis())
        alone_port = int(alone.connection_pool.connection_kwargs["port"])
        one = stack.enter_context(redis_cluster.running(1, redis_cluster.FIRST_PORT + 10))
        three = stack.enter_context(redis_cluster.running(3, redis_cluster.FIRST_PORT))
        plans = {
            "store": (f"redis://127.0.0.1:{alone_port}/0", [alone_port]),
            "cluster1": (redis_cluster.url(one), one),
            "cluster3": (redis_cluster.url(three), three),
        }
        seen: dict[str, list[dict[str, Any]]] = {name: [] for name in plans}
        names = list(plans)
        for i in range(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                print(f"# round {i + 1}: {name}", file=sys.stderr, flush=True)
                seen[name].append(_spawn(*plans[name], jobs, variant))
    out = {name: _median_runs(runs, plans[name][1]) for name, runs in seen.items()}
    base = out["cluster1"]["capacity_jobs_s"]
    ratio = round(out["cluster3"]["capacity_jobs_s"] / base, 2) if base else None
    return {"variant": variant, "configs": out, "three_over_one": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_cluster")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--variant", default="conv", help="a bench.apps variant")
    parser.add_argument("--out", type=Path, help="write the result file here (with its run)")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count each master's instructions under valgrind (callgrind) "
        "instead of its CPU time; kept under 'instructions' in --out",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one store URL, in a child
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        ports = [int(p) for p in args.ports.split(",")]
        print(json.dumps(child(args.child, ports, args.jobs, args.variant)))
        return 0
    start = results.load()
    command = " ".join(
        ["python -m bench.scale_cluster", *(argv if argv is not None else sys.argv[1:])]
    )
    if args.instructions:
        return _instructions(args, command, start)
    found = measure(args.jobs, max(1, args.rounds), args.variant)
    data = {**results.meta(command, start), "jobs": args.jobs, "rounds": args.rounds, **found}
    if args.out:
        results.write(args.out, data)
    from bench import tables_scale

    print("\n".join(tables_scale.cluster_text(data)))
    return 0


def _instructions(args: argparse.Namespace, command: str, start: dict[str, Any]) -> int:
    """The instruction count (:mod:`bench.cluster_instructions`), kept beside the CPU run's
    figures in the same file."""
    from bench import cluster_instructions, tables_scale

    found = cluster_instructions.measure(args.jobs, args.variant)
    block = {**results.meta(command, start), **found}
    if args.out:
        kept = results.read(args.out) if args.out.exists() else {}
        results.write(args.out, {**kept, "instructions": block})
    print("\n".join(tables_scale.cluster_instructions({"instructions": block})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
