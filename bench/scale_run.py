"""One variant's phases for ``bench.scale``, in a process of its own.

A convention variant (:mod:`bench.apps`) and a raw Celery one (:mod:`bench.apps_raw`)
never share a process: the layer's ``before_task_publish`` handler is process-wide and
would run on raw publishes. So ``bench.scale`` runs ``python -m bench.scale --variant V``
for each, pointed at its Redis by ``BENCH_REDIS_URL``; this module is what that process
does: publish ``N`` jobs with no worker up, then drain them with one prefork worker
(``-c 2``), the counters read around each phase; the bytes left, by kind of key; then a
tenth as many jobs again with ``MONITOR`` counting the round trips.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from bench import common, keep, procs
from bench.scale_meter import Meter, Phase, Trips, beam_pids

#: the convention variants ``bench.scale`` measures (:mod:`bench.apps`) and the raw ones
CONV = ("conv", "quiet", "conv_noruns")
RAW = ("raw", "default")


def env(amqp: str | None) -> dict[str, str]:
    full = common.env()
    if amqp:
        full["CELERY_BROKER_URL"] = amqp
    return full


def measure(client: Any, variant: str, jobs: int, amqp: str | None, trips: bool) -> dict[str, Any]:
    """``variant``'s publish and run phases (and the bytes its jobs left behind); with
    ``trips``, a second, smaller pass whose round trips ``MONITOR`` counts."""
    phases, kinds = _measure(client, variant, jobs, amqp, "a")
    if trips:
        port = client.connection_pool.connection_kwargs["port"]
        with Trips(port) as counter:
            address, _, client_port = str(_poller(client).client_info()["addr"]).rpartition(":")
            counter.ignore.add((address, client_port))
            counted, _ = _measure(client, variant, max(100, jobs // 10), amqp, "b", counter)
        for phase, seen in zip(phases, counted, strict=True):
            phase.redis_trips, phase.trips = seen.redis_trips, seen.trips
    return {"phases": phases, "keep": keep.summary(kinds)}


def _measure(  # noqa: PLR0917
    client: Any, variant: str, jobs: int, amqp: str | None, run: str, trips: Trips | None = None
) -> tuple[list[Phase], list[keep.Kind]]:
    os.environ.update({k: v for k, v in env(amqp).items() if k != "PYTHONPATH"})
    client.flushdb()
    delay, app = _task(variant)
    broker = "rabbitmq" if amqp else "redis"
    pids = beam_pids(amqp) if amqp else []
    delay(f"warm{run}")  # connections made and the queue declared first
    meter = Meter(client, broker, variant, pids)
    if trips is not None:
        trips.take()
    for n in range(jobs):
        delay(f"o{run}{n}")
    published = meter.done("publish", jobs, trips)
    worker = _worker(amqp, variant, app)
    try:
        meter = Meter(client, broker, variant, pids)  # the worker's start is part of its cost
        worker.wait_ready()
        _drained(_poller(client), variant, jobs + 1)
        ran = meter.done("run", jobs, trips)
    finally:
        worker.stop()
    if worker.errors():
        raise RuntimeError("the worker logged errors:\n" + "\n".join(worker.errors()[:20]))
    kinds = [] if trips is not None else keep.read(client, jobs + 1, _limits(variant))
    return [published, ran], kinds


def _task(variant: str) -> tuple[Callable[[str], Any], str]:
    """How to publish one job of ``variant``, and its app for ``celery -A``."""
    if variant in RAW:
        from bench import apps_raw

        raw_task = getattr(apps_raw, variant).tasks[f"bench.noop_{variant}"]
        return lambda order: raw_task.delay(order_id=order), f"bench.apps_raw:{variant}"
    from bench import apps

    task = getattr(apps, variant).tasks[apps.task_name(variant)]
    return lambda order: task.delay(order_id=order), f"bench.apps:{variant}"


def _limits(variant: str) -> dict[str, dict[str, float]]:
    """The layer's retention and caps by kind of key (none for raw Celery)."""
    if variant in RAW:
        return {}
    from bench import apps
    from conventions.config import settings

    conf = settings.read(getattr(apps, variant).conf)
    return {
        "run record": {"purged_after": conf.runs_retention, "cap": conf.runs_max},
        "audit trail": {"purged_after": conf.audit_retention, "cap": conf.audit_max_trails},
    }


def _worker(amqp: str | None, variant: str, app: str) -> procs.Worker:
    name = f"scale_{variant}"
    ready = procs.run_dir() / f"{name}.ready"
    argv = [
        common.python(), "-m", "bench.launch", "--no-hiredis", "--ready", str(ready), "--",
        "-A", app, "worker", "-P", "prefork", "-c", "2",
        "-Q", f"bench_{variant}", "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "--loglevel=WARNING",
    ]  # fmt: skip
    return procs.Worker(name, argv, ready, env=env(amqp))


_POLLERS: dict[int, Any] = {}


def _poller(client: Any) -> Any:
    """The one connection the bench polls on (the round-trip count leaves it out)."""
    import redis

    port = int(client.connection_pool.connection_kwargs["port"])
    if port not in _POLLERS:
        _POLLERS[port] = redis.Redis(port=port, single_connection_client=True)
    return _POLLERS[port]


def _drained(poll: Any, variant: str, jobs: int, timeout: float = 600) -> None:
    """Until ``jobs`` ran: the store's succeeded count (the layer's audit counters), or
    raw Celery's queue and its unacked hash empty on two polls in a row (a late ack comes
    after the result write; a message between ``BRPOP`` and the hash is in neither)."""
    done = _succeeded if variant not in RAW else _emptied(variant)
    deadline = time.monotonic() + timeout
    streak = 0
    while time.monotonic() < deadline:
        streak = streak + 1 if done(poll, jobs) else 0
        if streak >= (1 if variant not in RAW else 2):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{variant}: {jobs} jobs not drained in {timeout:.0f}s")


def _succeeded(poll: Any, jobs: int) -> bool:
    from conventions.store import counts, keys

    found = poll.hgetall(keys.counts())
    events = counts.events({counts.split(k.decode()): int(v) for k, v in found.items()})
    return sum(n for (event, _), n in events.items() if event == "succeeded") >= jobs


def _emptied(variant: str) -> Callable[[Any, int], bool]:
    def done(poll: Any, jobs: int) -> bool:
        return int(poll.llen(f"bench_{variant}")) == 0 and int(poll.hlen("unacked")) == 0

    return done
