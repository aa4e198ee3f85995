"""The peers measured for context: dramatiq, huey and rq on the same Redis database.

Each peer is described once: how to publish its no-op job, the worker command (two
processes, like ``-P prefork -c 2``), its queue's Redis list, and how to tell that no
job is still in flight. A peer whose package is not installed is skipped (``pip install
-e '.[bench]'``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from bench import common


@dataclass(frozen=True)
class Peer:
    """What the harness needs to know about one peer."""

    name: str
    #: the package that must be importable
    package: str
    #: the Redis list its jobs wait in
    queue: str
    #: a line of its worker's log that says it is consuming
    ready: bytes

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def worker_argv(self) -> list[str]:
        python = common.python()
        if self.name == "dramatiq":
            return [python, "-m", "dramatiq", "bench.peer_dramatiq", "-p", "2", "-t", "1",
                    "-Q", "bench_dramatiq"]  # fmt: skip
        if self.name == "huey":
            return [python, "-m", "huey.bin.huey_consumer", "bench.peer_huey.huey", "-w", "2",
                    "-k", "process"]  # fmt: skip
        return [python, "-m", "rq.cli", "worker-pool", "-n", "2", "-u", common.url(),
                "bench_rq"]  # fmt: skip

    def in_flight(self, client: Any, hold: str) -> int:
        """Jobs taken from the queue and not finished yet (0 when unknown); ``hold`` is
        the list the harness keeps the jobs not handed out yet in."""
        if self.name == "dramatiq":
            # a message's data stays in the queue's hash until its worker acks it
            waiting = client.llen(self.queue) + client.llen(hold)
            return int(client.hlen(f"{self.queue}.msgs")) - int(waiting)
        if self.name == "rq":
            from rq.registry import StartedJobRegistry

            return int(StartedJobRegistry(name="bench_rq", connection=client).count)
        return 0  # huey keeps no record of a job being run


PEERS = {
    "dramatiq": Peer("dramatiq", "dramatiq", "dramatiq:bench_dramatiq", b"ready for action"),
    "huey": Peer("huey", "huey", "huey.redis.bench_huey", b"started with"),
    "rq": Peer("rq", "rq", "rq:queue:bench_rq", b"started"),
}


def available(names: Sequence[str] = tuple(PEERS)) -> tuple[list[Peer], list[str]]:
    """The installed peers, and a note for each one skipped."""
    found = [PEERS[name] for name in names if PEERS[name].installed()]
    skipped = [f"{name}: not installed" for name in names if not PEERS[name].installed()]
    return found, skipped


def publisher(name: str) -> Callable[[str], object]:
    """The peer's way to enqueue the no-op job (in the publisher subprocess)."""
    if name == "dramatiq":
        from bench import peer_dramatiq

        return cast(Callable[[str], object], peer_dramatiq.noop.send)
    if name == "huey":
        from bench import peer_huey

        return cast(Callable[[str], object], peer_huey.noop)
    import redis
    from rq import Queue

    from bench import peer_rq

    queue = Queue(peer_rq.QUEUE, connection=redis.Redis.from_url(common.url()))
    return lambda order_id: queue.enqueue(peer_rq.noop, order_id=order_id)
