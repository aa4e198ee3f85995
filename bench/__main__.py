"""``python -m bench [SECTION ...] [--quick]``: the benchmarks against raw Celery and peers.

Sections (all by default, in this order): ``publish``, ``drain``, ``options``, ``promises``,
``latency``, ``transport``, ``priorities``, ``idle``, ``peers``, ``growth``, ``store``, ``profile``,
``rabbitmq`` (the layer against raw Celery on RabbitMQ: ``BENCH_AMQP_URL``). Every
comparison is interleaved (A B A B ..., at least 5 rounds) and reported as the median of
its per-round ratios: the machines are shared and noisy, absolute times are not.
``--quick`` shrinks every size (a few minutes); the full run takes about 28 on 2 quiet
cores (``idle``'s 600 wake-up trials about 16 of them, the rest 12). The results
print as Markdown (``--out`` writes them to a file, ``--json`` as data). Redis:
``BENCH_REDIS_URL`` (default DB 14), emptied by the run. Never part of ``make test``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SECTIONS = (
    "publish",
    "drain",
    "options",
    "promises",
    "latency",
    "transport",
    "priorities",
    "idle",
    "peers",
    "growth",
    "store",
    "profile",
    "rabbitmq",
)


@dataclass(frozen=True)
class Sizes:
    """How much each section does."""

    rounds: int
    publish: int
    drain: int
    options: int
    latency: int
    peers: int
    backlog: int
    growth: int
    profile: int


FULL = Sizes(rounds=5, publish=300, drain=20_000, options=5_000, latency=300, peers=5_000,
             backlog=100_000, growth=1_000, profile=1_000)  # fmt: skip
QUICK = Sizes(rounds=5, publish=150, drain=2_000, options=400, latency=100, peers=400,
              backlog=20_000, growth=200, profile=200)  # fmt: skip


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help=f"one or more of {', '.join(SECTIONS)} (default: all)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="small sizes: a few minutes")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (at least 5 counts)")
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for the load average to fall",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(SECTIONS)}")
    args.sections = [name for name in SECTIONS if name in args.sections] or list(SECTIONS)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run."""
    parts = ["python -m bench", *args.sections]
    if args.sections == list(SECTIONS):
        parts = ["python -m bench"]
    if args.quick:
        parts.append("--quick")
    if args.rounds is not None:
        parts.append(f"--rounds {args.rounds}")
    return " ".join(parts)


def main(argv: list[str]) -> int:
    args = parse(argv)
    from bench import common

    common.use_bench_env()
    import redis

    from bench import (
        drain,
        growth,
        growth_store,
        idle,
        latency,
        peers,
        priorities,
        profile,
        publish,
        rabbitmq,
    )
    from bench import transport as transport_section
    from bench.report import Report

    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or sizes.rounds
    from bench import results

    report = Report(command=command_line(args), load_at_start=results.settle(args.settle))
    client = redis.Redis.from_url(common.url())
    runs = {
        "publish": lambda: publish.section(report, client, n=sizes.publish, rounds=rounds),
        "drain": lambda: drain.section(report, client, n=sizes.drain, rounds=rounds),
        "options": lambda: drain.options_section(report, client, n=sizes.options, rounds=rounds),
        "promises": lambda: drain.promises_section(report, client, n=sizes.options, rounds=rounds),
        "latency": lambda: latency.section(report, client, samples=sizes.latency),
        "transport": lambda: transport_section.section(
            report, client, n=sizes.options, rounds=rounds
        ),
        "priorities": lambda: priorities.section(report, client, n=sizes.options, rounds=rounds),
        "idle": lambda: idle.section(
            report, client, seconds=5 if args.quick else 10, trials=20 if args.quick else 100
        ),
        "peers": lambda: peers.section(report, client, n=sizes.peers, rounds=rounds),
        "growth": lambda: growth.section(
            report, client, size=sizes.backlog, n=sizes.growth, rounds=rounds
        ),
        "store": lambda: growth_store.section(
            report, client, size=sizes.backlog, n=sizes.growth, rounds=rounds
        ),
        "profile": lambda: report.profile.extend(profile.section(client, sizes.profile)),
        "rabbitmq": lambda: rabbitmq.section(
            report, client, publish_n=sizes.publish, drain_n=sizes.drain // 2, rounds=rounds
        ),
    }
    for name in args.sections:
        start = time.monotonic()
        print(f"# {name} ...", file=sys.stderr, flush=True)
        runs[name]()
        report.notes.append(f"{name}: {time.monotonic() - start:.0f} s")
    client.close()
    text = report.markdown()
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        report.save(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
