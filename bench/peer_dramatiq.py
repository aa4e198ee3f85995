"""The no-op job on dramatiq (Redis broker, default middleware), for ``bench.peers``.

``dramatiq bench.peer_dramatiq -p 2 -t 1 -Q bench_dramatiq``: two processes of one thread,
the shape of ``celery worker -P prefork -c 2``.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

QUEUE = "bench_dramatiq"

broker = RedisBroker(  # type: ignore[no-untyped-call]
    url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def noop(order_id: str) -> None:
    """Nothing, like the other variants."""
