"""``python -m bench.fleet [--consumers 100] [--procs 4] [--queues 1,5] [--real N]
[--seconds S] [--out FILE]``: what an idle fleet costs its Redis.

A fleet of ``--consumers`` consumers is simulated on this machine: ``--procs`` processes,
each opening its share as threads, every one a kombu ``Connection`` on the layer's
transport (``conventions.transport.redis:Transport``) with a ``Consumer`` of the queues
and a drain loop, as a worker's main process does: its fetch with its back-off, its
keeper (beats, sweeps, the delayed mover), its connections. Nothing is published: the
fleet is idle. On a ``redis-server`` of this run's own (nothing else talks to it), after
a warm-up: Redis's CPU per second (``INFO cpu``) and the connections held (``INFO
clients``) over ``--seconds``; then, over as long again, the commands clients sent per
second, by command, as ``MONITOR`` sees them (a script counts once, a ``MULTI``/``EXEC``
once; a window of its own, so that MONITOR's cost stays out of the CPU). ``--real N``
also runs ``N`` real ``celery worker --pool solo`` processes (the reliable profile,
``bench.apps:conv``, events on: their heartbeats are Celery's), the same way.

The sweep's cost is measured apart: one sweep (a keeper's dead-consumer check, one
script; kombu's restore of the unacked set follows it, counted in the fleet's commands)
with the fleet registered, its commands and its Redis
CPU over many calls; the fleet sends ``consumers / (recovery_timeout / 3)`` a second.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench import common, results

#: the transport a worker of the layer runs
TRANSPORT = "conventions.transport.redis:Transport"
#: the profile's default ``recovery_timeout``: a sweep every third of it per consumer
RECOVERY_TIMEOUT = 30.0


#: what a sweep sends: its script (what the script runs inside is not a command sent)
SCRIPTS = {"eval", "evalsha"}


def _stats(client: redis.Redis) -> tuple[dict[str, int], float]:
    stats = client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return calls, _cpu(client)


def _cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def window(client: redis.Redis, seconds: float, size: int) -> dict[str, Any]:
    """The fleet's cost: Redis CPU per second and the connections over ``seconds``; then,
    over as long again, the commands clients sent (``MONITOR``, :class:`bench.scale_meter.
    Trips`: a script is one, what it runs inside is not; a ``MULTI``/``EXEC`` is one), in
    all and per consumer, by command. Apart, so that MONITOR's own cost stays out of the
    CPU."""
    from bench.scale_meter import Trips

    cpu0, t0 = _cpu(client), time.monotonic()
    time.sleep(seconds)
    cpu = (_cpu(client) - cpu0) / (time.monotonic() - t0)
    connections = int(client.info("clients")["connected_clients"]) - 1
    with Trips(int(client.connection_pool.connection_kwargs["port"])) as trips:
        trips.take()
        t1 = time.monotonic()
        time.sleep(seconds)
        sent = trips.take()
        took = time.monotonic() - t1
    total = sum(sent.values()) / took
    return {
        "seconds": round(took, 1),
        "commands_per_s": round(total, 1),
        "commands_per_s_per_consumer": round(total / size, 2),
        "by_command_per_s": {k: round(v / took, 2) for k, v in sent.most_common()},
        "redis_cpu_us_per_s": round(cpu * 1e6),
        "connections": connections,
    }


def consume(url: str, consumers: int, queues: int) -> None:
    """``consumers`` idle consumers of ``queues`` queues, in threads, until killed."""
    from kombu import Connection, Consumer, Exchange, Queue

    names = ["email", "heavy", *[f"q{n}" for n in range(queues - 2)]][:queues]
    declared = [Queue(n, Exchange(n, type="direct"), routing_key=n) for n in names]
    started = threading.Semaphore(0)

    def one() -> None:
        options = {"priority_steps": [0]}
        with (
            Connection(url, transport=TRANSPORT, transport_options=options) as connection,
            Consumer(connection, declared, on_message=lambda message: None, prefetch_count=1),
        ):
            started.release()
            while True:
                with contextlib.suppress(TimeoutError):
                    connection.drain_events(timeout=1.0)

    for _ in range(consumers):
        threading.Thread(target=one, daemon=True).start()
    for _ in range(consumers):
        started.acquire()
    print("ready", flush=True)
    threading.Event().wait()  # until terminated


def _share(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@contextlib.contextmanager
def simulated(url: str, consumers: int, procs: int, queues: int) -> Any:
    """The fleet's processes, each once all its consumers consume; stopped after."""
    started = []
    try:
        for share in _share(consumers, procs):
            argv = [sys.executable, "-m", "bench.fleet", "--child", url, "--consumers",
                    str(share), "--queues", str(queues)]  # fmt: skip
            started.append(subprocess.Popen(argv, cwd=common.ROOT, env=common.env(),
                                            stdout=subprocess.PIPE, text=True))  # fmt: skip
        for proc in started:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a fleet process did not start its consumers")
        yield started
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)


@contextlib.contextmanager
def real(count: int) -> Any:
    """``count`` real ``celery worker --pool solo`` processes (the reliable profile),
    each once ready; stopped after."""
    from bench import procs

    workers = []
    try:
        for n in range(count):
            name = f"fleet{n}"
            ready = procs.run_dir() / f"{name}.ready"
            argv = [common.python(), "-m", "bench.launch", "--ready", str(ready), "--",
                    "-A", "bench.apps:conv", "worker", "-P", "solo", "-Q", "bench_conv",
                    "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
                    "--loglevel=WARNING"]  # fmt: skip
            workers.append(procs.Worker(name, argv, ready))
        for worker in workers:
            worker.wait_ready(timeout=600)
        yield workers
    finally:
        for worker in workers:
            worker.stop()


def sweep(client: redis.Redis, size: int, calls: int = 500) -> dict[str, Any]:
    """One sweep when nobody died, ``size`` consumers registered: its commands and its
    Redis CPU (over ``calls`` sweeps)."""
    from conventions.transport import liveness
    from conventions.transport.layout import CONSUMERS, INBOX, INBOXES

    client.flushdb()
    now = float(client.time()[0])
    for _ in range(size):
        consumer = uuid.uuid4().hex
        client.zadd(CONSUMERS, {consumer: now + RECOVERY_TIMEOUT})
        client.hset(INBOXES, INBOX.format(consumer=consumer, source="email"), "email")
    calls0, cpu0 = _stats(client)
    for _ in range(calls):
        liveness.give_back_dead(client, "sweeper", grace=RECOVERY_TIMEOUT)
    calls1, cpu1 = _stats(client)
    sent = sum(v - calls0.get(k, 0) for k, v in calls1.items() if k in SCRIPTS)
    per_cpu = (cpu1 - cpu0) / calls * 1e6
    rate = size / (RECOVERY_TIMEOUT / 3)
    client.flushdb()
    return {"consumers": size, "commands": round(sent / calls, 2),
            "redis_cpu_us": round(per_cpu, 1),
            "fleet_sweeps_per_s": rate, "fleet_cpu_us_per_s": round(per_cpu * rate)}  # fmt: skip


def measure(consumers: int, procs: int, queue_counts: list[int], real_count: int,
            seconds: float) -> dict[str, Any]:  # fmt: skip
    from bench.idle import own_redis

    runs = []
    with own_redis() as client:
        port = client.connection_pool.connection_kwargs["port"]
        url = f"redis://127.0.0.1:{port}/0"
        os.environ["BENCH_REDIS_URL"] = url
        for queues in queue_counts:
            client.flushdb()
            print(f"# {consumers} simulated consumers of {queues} queue(s)", file=sys.stderr)
            with simulated(url, consumers, procs, queues):
                time.sleep(15)  # the first beats and sweeps, the fetch waits grown
                runs.append({"fleet": "simulated", "consumers": consumers, "queues": queues,
                             **window(client, seconds, consumers)})  # fmt: skip
        if real_count:
            client.flushdb()
            print(f"# {real_count} real solo workers", file=sys.stderr)
            with real(real_count):
                time.sleep(15)
                runs.append({"fleet": "real", "consumers": real_count, "queues": 1,
                             **window(client, seconds, real_count)})  # fmt: skip
        sweeps = [sweep(client, size) for size in (1, consumers)]
    return {"runs": runs, "sweeps": sweeps, "recovery_timeout": RECOVERY_TIMEOUT}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet")
    parser.add_argument("--consumers", type=int, default=100)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--queues", default="1,5", help="queue counts, comma-separated")
    parser.add_argument("--real", type=int, default=0, help="also N real solo workers")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", type=Path, help="write the result file here (with its run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a fleet process: the Redis URL
    args = parser.parse_args(argv)
    if args.child:
        consume(args.child, args.consumers, int(args.queues))
        return 0
    start = results.load()
    counts = [int(q) for q in args.queues.split(",")]
    found = measure(args.consumers, args.procs, counts, args.real, args.seconds)
    command = " ".join(["python -m bench.fleet", *(argv if argv is not None else sys.argv[1:])])
    data = {**results.meta(command, start), **found}
    if args.out:
        results.write(args.out, data)
    from bench import tables_scale

    print("\n".join([*tables_scale.fleet_idle(data), "", *tables_scale.fleet_sweep(data)[2:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
