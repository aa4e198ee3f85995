"""``python -m bench.scale [--jobs N] [--amqp URL]``: what one job costs the servers.

The figures the at-scale page (``docs/discussions/at-scale.md``) multiplies out to 100
workers and 10,000 jobs/s: per job, the Redis commands and the Redis CPU time of its
publish and of its run, and the bytes it leaves behind; on RabbitMQ (``--amqp``), the
broker's CPU time per job (``beam.smp``'s user + system time from ``/proc``, so it runs
as a user who may read RabbitMQ's process) and the store's Redis commands per job. A
failover list of a cluster's nodes (``--amqp "amqp://a:5700//;amqp://b:5701//;..."``)
sums the CPU of every node's VM (:mod:`bench.beam` finds each by its port): the
replication's share is the cluster's figure against one node's.

Each figure is a difference of the server's own counters (``INFO commandstats``,
``INFO cpu``, ``INFO memory``; ``/proc/<pid>/stat``) taken around one phase, on a
``redis-server`` of the run's own (nothing else talks to it): ``publish`` (``N``
``.delay()`` calls, no worker up), then ``run`` (one prefork worker, ``-c 2``, drains
them; its idle fetches and keeper beats are counted in). Not a speed test: a cost count.
RabbitMQ's node is shared with whatever else runs on the machine: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import beam, common, procs

#: the jobs per measured phase unless ``--jobs`` says otherwise
DEFAULT_JOBS = 2000
#: the measured variants of :mod:`bench.apps`: the reliable profile, and ``quiet`` (no
#: stored results, no STARTED state, no task events, prefetch 4)
VARIANTS = ("conv", "quiet")


@dataclass
class Phase:
    """One phase's cost per job, from the servers' counters."""

    phase: str
    broker: str
    variant: str
    jobs: int
    seconds: float
    #: Redis commands per job, those run inside scripts included
    redis_commands: float
    #: Redis round trips per job: commands sent by a client (a script is one, a MULTI/EXEC
    #: pipeline is one), counted by ``MONITOR`` in a second, smaller pass (MONITOR's own
    #: cost stays out of the CPU)
    redis_trips: float | None
    #: Redis CPU (user + system) per job, microseconds
    redis_cpu_us: float
    #: RabbitMQ CPU (user + system) per job, microseconds (None on Redis)
    rabbitmq_cpu_us: float | None
    #: Redis memory the phase left per job, bytes (audit, run history, ledger, results)
    redis_bytes: float
    #: the commands behind ``redis_commands``, per job, the busiest first
    commands: dict[str, float]
    #: the commands behind ``redis_trips``, per job, the busiest first
    trips: dict[str, float] = field(default_factory=dict)


def _counters(client: Any) -> tuple[dict[str, int], float, int]:
    stats = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    cpu = client.info("cpu")
    used = int(client.info("memory")["used_memory"])
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), used


def beam_pid() -> int | None:
    """The RabbitMQ node's Erlang VM on this machine, or None."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "beam.smp":
                    return int(entry.name)
            except OSError:
                continue
    return None


def beam_cpu(pid: int | None) -> float | None:
    """Seconds of CPU (user + system) the process has used."""
    return beam.cpu(pid)


def beam_pids(amqp: str) -> list[int]:
    """The VMs of the nodes ``amqp`` names (each of a cluster's), found by their ports;
    else the first ``beam.smp`` of the machine."""
    found = beam.pids(amqp)
    if found:
        return found
    pid = beam_pid()
    return [pid] if pid is not None else []


class Meter:
    """The counters before a phase, and its cost per job after it."""

    def __init__(self, client: Any, broker: str, variant: str, pids: list[int]) -> None:
        self.client, self.broker, self.variant, self.pids = client, broker, variant, pids
        self.client.config_resetstat()
        self.start = _counters(client)
        self.beam = beam.cpu_of(pids)
        self.t0 = time.monotonic()

    def done(self, phase: str, jobs: int, trips: Trips | None = None) -> Phase:
        seconds = time.monotonic() - self.t0
        calls, cpu, used = _counters(self.client)
        before, cpu0, used0 = self.start
        delta = {k: v - before.get(k, 0) for k, v in calls.items()}
        delta.pop("config|resetstat", None)
        delta.pop("info", None)
        vms = beam.cpu_of(self.pids)
        rabbit = None if vms is None or self.beam is None else (vms - self.beam) / jobs * 1e6
        per = {k: round(v / jobs, 3) for k, v in sorted(delta.items(), key=lambda kv: -kv[1])}
        found = Phase(
            phase, self.broker, self.variant, jobs, round(seconds, 2),
            round(sum(delta.values()) / jobs, 2), None, round((cpu - cpu0) / jobs * 1e6, 1),
            None if rabbit is None else round(rabbit, 1), round((used - used0) / jobs, 1),
            {k: v for k, v in per.items() if v >= 0.01},
        )  # fmt: skip
        if trips is not None:
            sent = trips.take()
            found.redis_trips = round(sum(sent.values()) / jobs, 2)
            found.trips = {k: round(v / jobs, 2) for k, v in sent.most_common() if v / jobs >= 0.01}
        return found


def _env(amqp: str | None) -> dict[str, str]:
    env = common.env()
    if amqp:
        env["CELERY_BROKER_URL"] = amqp
    return env


def measure(jobs: int, amqp: str | None) -> list[Phase]:
    """For each variant: publish ``jobs``, then drain them with one worker, on a Redis of
    this run's own (the apps read its URL once, at import); the cost of each phase; then
    the round trips of a tenth as many, counted."""
    from bench.idle import own_redis

    out: list[Phase] = []
    with own_redis() as client:
        port = client.connection_pool.connection_kwargs["port"]
        os.environ["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        for variant in VARIANTS:
            phases = _measure(client, jobs, amqp, variant, "a")
            with Trips(port) as trips:
                counted = _measure(client, max(100, jobs // 10), amqp, variant, "b", trips)
            for phase, seen in zip(phases, counted, strict=True):
                phase.redis_trips, phase.trips = seen.redis_trips, seen.trips
            out += phases
    return out


class Trips:
    """Counts the commands clients send (``MONITOR``: a script is one line, the
    commands it runs are marked ``lua``) from a thread, per phase."""

    def __init__(self, port: int) -> None:
        import redis

        self.client = redis.Redis(port=port)
        self.count: collections.Counter[str] = collections.Counter()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Trips:
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop = True
        self.client.ping()  # one more line: the monitor loop sees the stop
        self._thread.join(5)

    def _run(self) -> None:
        in_transaction: set[tuple[Any, Any]] = set()  # clients between MULTI and EXEC
        with self.client.monitor() as monitor:
            for command in monitor.listen():
                if self._stop:
                    return
                name = str(command.get("command", "")).split(" ", 1)[0].lower()
                if command.get("client_type") == "lua" or name == "info":
                    continue
                # a MULTI ... EXEC pipeline is written at once: one trip, counted as its
                # EXEC (MONITOR shows each command of it, MULTI too)
                client = (command.get("client_address"), command.get("client_port"))
                if name == "multi":
                    in_transaction.add(client)
                elif name in ("exec", "discard"):
                    in_transaction.discard(client)
                    self.count["exec"] += 1
                elif client not in in_transaction:
                    self.count[name] += 1

    def take(self) -> collections.Counter[str]:
        count, self.count = self.count, collections.Counter()
        return count


def _measure(  # noqa: PLR0917
    client: Any, jobs: int, amqp: str | None, variant: str, run: str,
    trips: Trips | None = None,
) -> list[Phase]:  # fmt: skip
    os.environ.update({k: v for k, v in _env(amqp).items() if k != "PYTHONPATH"})
    from bench import apps

    client.flushdb()
    task = getattr(apps, variant).tasks[apps.task_name(variant)]
    broker = "rabbitmq" if amqp else "redis"
    pids = beam_pids(amqp) if amqp else []
    task.delay(order_id=f"warm{run}")  # connections made and the queue declared first
    meter = Meter(client, broker, variant, pids)
    if trips is not None:
        trips.take()
    for n in range(jobs):
        task.delay(order_id=f"o{run}{n}")
    published = meter.done("publish", jobs, trips)
    worker = _worker(amqp, variant)
    try:
        meter = Meter(client, broker, variant, pids)  # the worker's start is part of its cost
        worker.wait_ready()
        _drained(jobs + 1)
        ran = meter.done("run", jobs, trips)
    finally:
        worker.stop()
    if worker.errors():
        raise RuntimeError("the worker logged errors:\n" + "\n".join(worker.errors()[:20]))
    return [published, ran]


def _worker(amqp: str | None, variant: str) -> procs.Worker:
    from bench import apps

    name = f"scale_{variant}"
    ready = procs.LOG_DIR / f"{name}.ready"
    argv = [
        common.python(), "-m", "bench.launch", "--no-hiredis", "--ready", str(ready), "--",
        "-A", f"bench.apps:{variant}", "worker", "-P", "prefork", "-c", "2",
        "-Q", apps.queue(variant), "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "--loglevel=WARNING",
    ]  # fmt: skip
    return procs.Worker(name, argv, ready, env=_env(amqp))


def _drained(jobs: int, timeout: float = 600) -> None:
    """Until the store counted ``jobs`` succeeded runs (the audit's counters)."""
    from conventions.store import counts, open_store

    store = open_store(common.url())
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            events = counts.events(store.counters())
            if sum(n for (event, _), n in events.items() if event == "succeeded") >= jobs:
                return
            time.sleep(0.2)
    finally:
        store.close()
    raise TimeoutError(f"{jobs} jobs not drained in {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--amqp", help="also measure on this RabbitMQ (amqp://...)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only-amqp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.only_amqp:  # the RabbitMQ half, in a process of its own (see below)
        _print(measure(args.jobs, args.only_amqp), as_json=True)
        return 0
    phases = measure(args.jobs, None)
    if args.amqp:  # a process of its own: the app reads its broker at import
        out = subprocess.run(
            [sys.executable, "-m", "bench.scale", "--jobs", str(args.jobs), "--json",
             "--only-amqp", args.amqp],
            cwd=common.ROOT, env=_env(None), capture_output=True, text=True, check=True,
        )  # fmt: skip
        phases += [Phase(**row) for row in json.loads(out.stdout)]
    _print(phases, args.json)
    return 0


def _print(phases: list[Phase], as_json: bool) -> None:
    if as_json:
        print(json.dumps([asdict(p) for p in phases]))
        return
    print("| broker | variant | phase | jobs | Redis trips/job | Redis cmds/job | Redis CPU us/job "
          "| RabbitMQ CPU us/job | Redis bytes/job | sent per job | run per job |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in phases:
        top = ", ".join(f"{k} {v:g}" for k, v in list(p.commands.items())[:5])
        sent = ", ".join(f"{k} {v:g}" for k, v in list(p.trips.items())[:6])
        rabbit = "-" if p.rabbitmq_cpu_us is None else f"{p.rabbitmq_cpu_us:g}"
        cells = [p.broker, p.variant, p.phase, p.jobs, p.redis_trips, f"{p.redis_commands:g}",
                 f"{p.redis_cpu_us:g}", rabbit, f"{p.redis_bytes:,.0f}", sent, top]  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
