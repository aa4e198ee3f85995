"""The publisher of the Redis Cluster chaos run (``python -m
tests.acceptance.support_cluster_chaos <count> <patience>``): the reference app
(``tasks``), its store on the cluster (``CONVENTIONS_STORE_URL=redis+cluster://...``),
its broker a Redis of the run's own.

Each ``.delay()`` either returns (acknowledged: its reservation and audit event are on
a master and one replica) or raises ``BackendUnavailable`` (a failover under way), and
is then tried again, with the same idempotency key, for ``patience`` seconds. Any other
exception ends the process with its traceback: a publish that fails any other way is a
finding. Prints, as JSON, the events acknowledged, the refusals and the publishes'
median time.
"""

from __future__ import annotations

import json
import sys
import time


def publish_main(count: int, patience: float) -> None:
    from conventions.errors import BackendUnavailable
    from tasks.payments import apply_event

    acknowledged, refusals, seconds = [], 0, []
    for number in range(1, count + 1):
        event_id = f"evt_{number:04d}"
        deadline = time.monotonic() + patience
        while True:
            started = time.perf_counter()
            try:
                apply_event.delay(event_id=event_id)
            except BackendUnavailable:
                refusals += 1
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
                continue
            seconds.append(time.perf_counter() - started)
            acknowledged.append(event_id)
            break
    seconds.sort()
    median = 1000 * seconds[len(seconds) // 2] if seconds else None
    print(json.dumps({"acknowledged": acknowledged, "refusals": refusals, "median_ms": median}))


if __name__ == "__main__":
    publish_main(int(sys.argv[1]), float(sys.argv[2]))
