"""The no-op job on rq, for ``bench.peers``.

``rq worker-pool -n 2 bench_rq``: two workers, each forking a work horse per job (rq's
default worker: the fork is part of its cost).
"""

from __future__ import annotations

QUEUE = "bench_rq"


def noop(order_id: str) -> None:
    """Nothing, like the other variants."""
