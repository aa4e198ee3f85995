"""CPU per job, by process: a worker's main process, its pool's processes, and Redis.

A drain's rate says how fast a variant went, not where its machine's time went: on a
2-core machine running Redis and a ``-P prefork -c 2`` worker, a variant can be slower
because it uses more CPU, or because its job's steps wait on each other (round trips
one after another) while cores sit idle. So each drain slice also reads, from
``/proc/<pid>/stat``, the CPU time (user + system) the worker's main process, its pool
processes and the Redis server used, divided by the jobs of the slice. Read on this
machine only: a Redis elsewhere (or one whose pid is not a ``redis-server`` here) is
left out, and the parts that could not be read are absent, never zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import beam, common

#: the parts of a job's CPU, in the order they are shown
PARTS = ("main", "pool", "redis")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (its pool), from every ``/proc/<pid>/stat``
    (not every kernel has ``/proc/<pid>/task/<tid>/children``)."""
    found: list[int] = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent = int(beam.stat_fields(entry.name)[1])
        except (OSError, IndexError):  # gone meanwhile
            continue
        if parent == pid:
            found.append(int(entry.name))
    return found


def redis_pid(client: Any) -> int | None:
    """The pid of the Redis server ``client`` talks to, when it runs on this machine."""
    try:
        pid = int(client.info("server")["process_id"])
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, KeyError, ValueError):
        return None
    return pid if comm.startswith("redis") else None


def _seconds(pid: int) -> float | None:
    try:
        return beam.cpu(pid)
    except OSError:  # gone (a pool process replaced)
        return None


def snapshot(worker: int, redis: int | None) -> dict[str, float]:
    """The CPU seconds used so far by each part (the parts that could be read)."""
    parts: dict[str, float | None] = {
        "main": _seconds(worker),
        "pool": sum(_seconds(child) or 0.0 for child in children(worker)),
        "redis": None if redis is None else _seconds(redis),
    }
    return {name: value for name, value in parts.items() if value is not None}


def per_job(before: Mapping[str, float], after: Mapping[str, float], jobs: int) -> dict[str, float]:
    """Microseconds of CPU per job of each part both snapshots read."""
    if jobs <= 0:
        return {}
    return {name: (after[name] - before[name]) / jobs * 1e6 for name in before if name in after}


def medians(slices: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each part's median over the slices that read it."""
    out: dict[str, float] = {}
    for name in PARTS:
        values = [s[name] for s in slices if name in s]
        if values:
            out[name] = common.median(values)
    return out


def total(parts: Mapping[str, float]) -> float:
    return sum(parts.values())


def shown(parts: Mapping[str, float]) -> str:
    """``main 744, pool 991, redis 394 us``."""
    return ", ".join(f"{name} {parts[name]:,.0f}" for name in PARTS if name in parts) + " us"
