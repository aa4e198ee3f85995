"""dramatiq, huey and rq beside raw Celery, for context: the same drain and publish.

Each peer drains the same no-op job from the same Redis database with two worker
processes (dramatiq ``-p 2 -t 1``, huey ``-w 2 -k process``, rq ``worker-pool -n 2``,
which forks a work horse per job as rq does by default), interleaved with raw Celery with
its defaults and with our reliable profile. A peer that is not installed is skipped with
a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import drain, procs
from bench.peer_apps import PEERS, Peer, available
from bench.report import Report


def target(peer: Peer) -> drain.Target:
    """A drain target for ``peer``: its worker command, its queue, its in-flight count."""

    def start() -> procs.Worker:
        return procs.Worker(peer.name, peer.worker_argv())

    item = drain.Target(
        name=peer.name,
        label=f"{peer.name} (2 processes, defaults)",
        queue=peer.queue,
        start_worker=start,
        producer=peer.name,
        ready_marker=peer.ready,
    )
    item.in_flight = lambda client: peer.in_flight(client, item.hold)
    return item


def targets(names: Sequence[str]) -> tuple[list[drain.Target], list[str]]:
    """The installed peers' drain targets, and notes for the skipped ones."""
    found, skipped = available(names)
    return [target(peer) for peer in found], skipped


def section(report: Report, client: Any, *, n: int, rounds: int) -> None:
    """Each installed peer's drain rate against raw Celery with its defaults."""
    client.flushdb()
    found, skipped = targets(list(PEERS))
    report.notes += [f"peers: {note}, skipped" for note in skipped]
    if not found:
        return
    rates = drain.run(client, [drain.target("default"), *found], n, rounds)
    for item in found:
        row = drain.ratio_row("peers", rates, item.name, "default")
        report.add(row)
    report.notes.append(f"peers: {n:,} jobs per peer in {rounds} interleaved slices")
    client.flushdb()
