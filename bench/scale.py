"""``python -m bench.scale [--jobs N] [--rounds R] [--out FILE] [--amqp URL]``: what one
job costs the servers, the layer beside raw Celery.

The figures the at-scale page (``docs/discussions/at-scale.md``) multiplies out and the
performance page compares: per job, the Redis round trips, commands and CPU time of its
publish and of its run, and the bytes it leaves behind by kind of key and how long they
stay (:mod:`bench.keep`); on RabbitMQ (``--amqp``), the broker's CPU time per job
(``beam.smp``'s, from ``/proc``: run as a user who may read RabbitMQ's process); a
failover list of a cluster's nodes (``--amqp "amqp://a:5700//;amqp://b:5701//;..."``)
sums the CPU of every node's VM (:mod:`bench.beam` finds each by its port): the
replication's share is the cluster's figure against one node's.

The variants (:data:`VARIANTS`): the layer's reliable profile (``conv``), ``quiet``, the
reliable profile without run history (``conv_noruns``: what run history costs), raw
Celery with the same reliable settings (``raw``) and raw Celery's defaults
(``default``). The audit trail cannot be turned off (no setting does), so its cost has no
row. Each variant runs in a process of its own (:mod:`bench.scale_run`) against one
``redis-server`` of this run's own (nothing else talks to it); the variants take turns,
round after round, and a CPU figure is the median of its rounds. Not a speed test: a cost
count. ``--pin`` gives the Redis server the last core and the variants (their producer and
worker) the others (``taskset``), so that Redis's CPU time per job is not moved by what
shares its core and caches; ``--variants conv,raw`` measures only those. ``--out`` writes
the result file the docs' tables are made from
(``bench/results/scale.json``, :mod:`bench.docs`), with the commit and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import common, results, scale_run
from bench.scale_meter import Meter, Phase, Trips, beam_cpu, beam_pid

__all__ = ["Meter", "Phase", "Trips", "beam_cpu", "beam_pid", "main"]

#: the jobs per measured phase unless ``--jobs`` says otherwise
DEFAULT_JOBS = 2000
#: the rounds (each variant once per round) unless ``--rounds`` says otherwise
DEFAULT_ROUNDS = 2
#: the measured variants, in the order of the tables
VARIANTS = ("conv", "raw", "quiet", "default", "conv_noruns")
#: also on RabbitMQ (``--amqp``): the layer's variants (raw Celery's apps are Redis's)
AMQP_VARIANTS = ("conv", "quiet")
#: the comparisons the result file keeps: (name, variant, against)
RATIOS = (
    ("conv/raw", "conv", "raw"),
    ("quiet/default", "quiet", "default"),
    ("conv_noruns/conv", "conv_noruns", "conv"),
    ("conv_noruns/raw", "conv_noruns", "raw"),  # the layer but run history, against raw
)


def child(variant: str, jobs: int, amqp: str | None, trips: bool) -> dict[str, Any]:
    """One variant's phases, measured in this process (``--variant``)."""
    import redis

    client = redis.Redis.from_url(common.url())
    found = scale_run.measure(client, variant, jobs, amqp, trips)
    return {"phases": [asdict(p) for p in found["phases"]], "keep": found["keep"]}


def pinning(pin: bool) -> tuple[list[str], list[str]]:
    """``taskset`` prefixes for the Redis server (the last core) and the variants (the
    others), or none: ``pin`` off, one core only, or no ``taskset``."""
    cores = os.cpu_count() or 1
    if not pin or cores < 2 or shutil.which("taskset") is None:
        return [], []
    return ["taskset", "-c", str(cores - 1)], ["taskset", "-c", f"0-{cores - 2}"]


def _spawn(
    variant: str, jobs: int, amqp: str | None, trips: bool, prefix: Sequence[str] = ()
) -> dict[str, Any]:
    argv = [*prefix, sys.executable, "-m", "bench.scale", "--variant", variant, "--jobs", str(jobs)]
    argv += ["--trips"] if trips else []
    argv += ["--amqp", amqp] if amqp else []
    out = subprocess.run(
        argv, cwd=common.ROOT, env=scale_run.env(None), capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"bench.scale --variant {variant} failed:\n{out.stderr[-4000:]}")
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def measure(
    jobs: int, rounds: int, amqp: str | None, variants: tuple[str, ...] = VARIANTS,
    pin: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Every variant's phases, ``rounds`` times in turn on one Redis of this run's own
    (then the layer's on RabbitMQ, with ``amqp``); the round trips and the bytes left
    from the first round. ``pin``: see :func:`pinning`."""
    from bench.idle import own_redis

    plans: list[tuple[str, str | None]] = [(v, None) for v in variants]
    plans += [(v, amqp) for v in AMQP_VARIANTS if amqp and v in variants]
    seen: dict[str, list[dict[str, Any]]] = {_name(*plan): [] for plan in plans}
    server, others = pinning(pin)
    with own_redis(wrap=server) as client:
        port = client.connection_pool.connection_kwargs["port"]
        os.environ["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        for i in range(rounds):
            for variant, broker in plans[i % len(plans) :] + plans[: i % len(plans)]:
                print(f"# round {i + 1}: {_name(variant, broker)}", file=sys.stderr, flush=True)
                found = _spawn(variant, jobs, broker, trips=i == 0, prefix=others)
                seen[_name(variant, broker)].append(found)
    phases = [_median(runs) for runs in seen.values()]
    return {
        "phases": [row for pair in phases for row in pair],
        "keep": {v: runs[0]["keep"] for v, runs in seen.items() if "@" not in v},
        "ratios": _ratios(seen),
        "pinned": bool(server),
    }


def _name(variant: str, amqp: str | None) -> str:
    return f"{variant}@rabbitmq" if amqp else variant


def _median(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first round's phases (its round trips) with the median CPU (Redis's and
    RabbitMQ's), commands and bytes of all rounds."""
    out = []
    for n, first in enumerate(runs[0]["phases"]):
        row = dict(first)
        every = [run["phases"][n] for run in runs]
        row["cpu_rounds"] = [p["redis_cpu_us"] for p in every]
        for name in ("redis_cpu_us", "redis_commands", "redis_bytes", "seconds",
                     "rabbitmq_cpu_us"):  # fmt: skip
            values = [p[name] for p in every if p[name] is not None]
            row[name] = round(statistics.median(values), 2) if values else None
        out.append(row)
    return out


def _ratios(seen: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each comparison of :data:`RATIOS`: Redis CPU, commands and round trips per job of
    a whole job (publish + run), the CPU as the median of the per-round ratios."""

    def per_job(run: dict[str, Any], name: str) -> float:
        return float(sum(p[name] or 0 for p in run["phases"]))

    out = []
    for label, a, b in RATIOS:
        if a not in seen or b not in seen:
            continue
        cpu = [per_job(x, "redis_cpu_us") / per_job(y, "redis_cpu_us")
               for x, y in zip(seen[a], seen[b], strict=True)]  # fmt: skip
        first_a, first_b = seen[a][0], seen[b][0]
        out.append({
            "ratio": label,
            "cpu": round(statistics.median(cpu), 2),
            "cpu_rounds": [round(r, 2) for r in cpu],
            "commands": round(per_job(first_a, "redis_commands")
                              / per_job(first_b, "redis_commands"), 2),
            "trips": round(per_job(first_a, "redis_trips") / per_job(first_b, "redis_trips"), 2),
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--amqp", help="also measure the layer on this RabbitMQ (amqp://...)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--settle", type=float, default=0.0, metavar="SECONDS",
        help="first wait up to SECONDS for the load average to fall",
    )  # fmt: skip
    parser.add_argument(
        "--pin",
        action="store_true",
        help="Redis on the last core, the variants on the others (taskset)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"which variants, comma-separated (default {','.join(VARIANTS)})",
    )
    parser.add_argument("--out", type=Path, help="write the result file here (with its run)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in a child
    parser.add_argument("--trips", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(child(args.variant, args.jobs, args.amqp, args.trips)))
        return 0
    start = results.settle(args.settle)
    chosen = tuple(v for v in args.variants.split(",") if v)
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}: choose among {', '.join(VARIANTS)}")
    found = measure(args.jobs, max(1, args.rounds), args.amqp, chosen, args.pin)
    command = " ".join(["python -m bench.scale", *(argv if argv is not None else sys.argv[1:])])
    data = {**results.meta(command, start), "jobs": args.jobs, "rounds": args.rounds, **found}
    data["notes"] = [
        "The audit trail cannot be turned off (no setting does): its cost is inside every "
        "row of the layer.",
        *([] if data["load"]["quiet"] else [
            "The machine was shared (load average at or above half its cores): the CPU "
            "figures are noisy; the round trips and commands are not."]),
    ]  # fmt: skip
    if args.out:
        results.write(args.out, data)
    if args.json:
        print(json.dumps(data))
    else:
        from bench import tables

        print("\n".join(tables.scale_text(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
