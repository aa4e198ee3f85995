"""``python -m bench.scale_rabbit [--jobs N] [--rounds R] [--out FILE]``: RabbitMQ's CPU
per job on one node and on a three-node cluster: the quorum queues' replication share.

Two private RabbitMQ installations' nodes of this run's own
(:class:`tests.acceptance.rabbit_cluster.RabbitCluster`: ports 5710-5712 for the three,
5713 for the one, distribution ports 20000 above; ``queue_leader_locator = balanced``),
the machine's own node (5672) and the chaos tests' ports (5700-5704) untouched. The
layer's variants (``conv``, the reliable profile; ``quiet``) run on each in turn, in a
process of their own (:func:`bench.scale._spawn`: 2,000 jobs published, then drained by
one prefork worker, ``-c 2``), round after round; the CPU of every node's VM comes from
``/proc`` (:mod:`bench.beam`, summed over the cluster's three). Each cluster's idle CPU
(its VMs with nothing to do, per second) is measured first and taken out of the per-job
figures: a cost per second, not per job. The store is a Redis of this run's own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import beam, results

DEFAULT_JOBS = 2000
DEFAULT_ROUNDS = 2
VARIANTS = ("conv", "quiet")
#: the clusters' AMQP ports: three nodes, and one
PORTS = {3: (5710, 5711, 5712), 1: (5713,)}


@contextlib.contextmanager
def cluster(ports: tuple[int, ...]) -> Iterator[str]:
    """A started cluster of ``len(ports)`` nodes: its failover URL; stopped after."""
    from tests.acceptance.rabbit_cluster import RabbitCluster

    with tempfile.TemporaryDirectory(prefix="cc-bench-rabbit-") as tmp:
        made = RabbitCluster(Path(tmp), ports)
        try:
            made.start()
            yield made.url
        finally:
            made.stop()


def idle(url: str, seconds: float = 10.0) -> float:
    """The VMs' CPU while nothing talks to them, µs per second (summed)."""
    pids = beam.pids(url)
    before = beam.cpu_of(pids) or 0.0
    time.sleep(seconds)
    return round(((beam.cpu_of(pids) or 0.0) - before) / seconds * 1e6, 1)


def _row(runs: list[dict[str, Any]], idle_us_s: float) -> list[dict[str, Any]]:
    """Per phase: RabbitMQ's CPU per job (median of the rounds, each less the idle VMs'
    share of its seconds) and the store's Redis CPU per job."""
    out = []
    for n, first in enumerate(runs[0]["phases"]):
        every = [run["phases"][n] for run in runs]
        net = [p["rabbitmq_cpu_us"] - idle_us_s * p["seconds"] / p["jobs"] for p in every]
        out.append({
            "phase": first["phase"],
            "rabbitmq_cpu_us": round(statistics.median(net), 1),
            "rabbitmq_cpu_rounds": [round(x, 1) for x in net],
            "gross_rabbitmq_cpu_us": round(
                statistics.median(p["rabbitmq_cpu_us"] for p in every), 1),
            "redis_cpu_us": round(statistics.median(p["redis_cpu_us"] for p in every), 1),
            "seconds": round(statistics.median(p["seconds"] for p in every), 2),
        })  # fmt: skip
    return out


def measure(jobs: int, rounds: int) -> dict[str, Any]:
    from bench import scale
    from bench.idle import own_redis

    with contextlib.ExitStack() as stack:
        store = stack.enter_context(own_redis())
        port = store.connection_pool.connection_kwargs["port"]
        os.environ["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        urls = {nodes: stack.enter_context(cluster(ports)) for nodes, ports in PORTS.items()}
        idles = {nodes: idle(url) for nodes, url in urls.items()}
        plans = [(nodes, variant) for nodes in sorted(urls) for variant in VARIANTS]
        seen: dict[tuple[int, str], list[dict[str, Any]]] = {plan: [] for plan in plans}
        for i in range(rounds):
            for nodes, variant in plans[i % len(plans) :] + plans[: i % len(plans)]:
                print(f"# round {i + 1}: {variant} on {nodes} node(s)", file=sys.stderr, flush=True)
                seen[nodes, variant].append(scale._spawn(variant, jobs, urls[nodes], trips=False))
    rows = [
        {"nodes": nodes, "variant": variant, "phases": _row(runs, idles[nodes])}
        for (nodes, variant), runs in seen.items()
    ]
    return {"idle_cpu_us_per_s": {str(n): v for n, v in idles.items()}, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_rabbit")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--out", type=Path, help="write the result file here (with its run)")
    args = parser.parse_args(argv)
    start = results.load()
    found = measure(args.jobs, max(1, args.rounds))
    command = " ".join(
        ["python -m bench.scale_rabbit", *(argv if argv is not None else sys.argv[1:])]
    )
    data = {**results.meta(command, start), "jobs": args.jobs, "rounds": args.rounds, **found}
    if args.out:
        results.write(args.out, data)
    from bench import tables_scale

    print("\n".join(tables_scale.rabbit_replication(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
