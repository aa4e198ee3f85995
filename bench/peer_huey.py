"""The no-op job on huey (Redis storage), for ``bench.peers``.

``huey_consumer bench.peer_huey.huey -w 2 -k process``: two worker processes.
"""

from __future__ import annotations

import os

from huey import RedisHuey  # type: ignore[import-untyped]

huey = RedisHuey("bench_huey", url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"))
#: the Redis list huey keeps its queue in
QUEUE = "huey.redis.bench_huey"


@huey.task()  # type: ignore[untyped-decorator]
def noop(order_id: str) -> None:
    """Nothing, like the other variants."""
