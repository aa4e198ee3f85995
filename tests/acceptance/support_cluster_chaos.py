"""The publisher of the failover chaos runs (``python -m
tests.acceptance.support_cluster_chaos <count> <patience> [<hold> <go>]``): the
reference app (``tasks``), its store on the Redis Cluster of the run
(``CONVENTIONS_STORE_URL=redis+cluster://...``), its broker a Redis of the run's own.
:func:`publish_events` is also the Sentinel runs' publisher
(``tests.integration.support_sentinel``).

Each ``.delay()`` either returns (acknowledged: its reservation and audit event are on
a master and one replica) or raises ``BackendUnavailable`` (a failover under way), and
is then tried again, with the same idempotency key, for ``patience`` seconds. Any other
exception ends the process with its traceback: a publish that fails any other way is a
finding. Prints, as JSON, the events acknowledged, the refusals and the publishes'
median time.

With ``hold`` and ``go`` (a file's path) it stops after ``hold`` jobs until the file
exists (the test creates it once its failover is under way; at most 120 s), so that the
rest are published through the failover however fast or slow the workers are.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def publish_events(count: int, patience: float, hold: int = 0, go: str = "") -> dict[str, Any]:
    """One payment job per event ``evt_0001``..; answers what the module prints."""
    from conventions.errors import BackendUnavailable
    from tasks.payments import apply_event

    acknowledged, refusals, seconds = [], 0, []
    for number in range(1, count + 1):
        if go and number == hold + 1:
            waited = time.monotonic() + 120
            while not os.path.exists(go) and time.monotonic() < waited:
                time.sleep(0.02)
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
    return {"acknowledged": acknowledged, "refusals": refusals, "median_ms": median}


def arguments(argv: list[str]) -> tuple[int, float, int, str]:
    """``<count> <patience> [<hold> <go>]``."""
    held = argv[3:5] if len(argv) > 4 else ["0", ""]
    return int(argv[1]), float(argv[2]), int(held[0]), held[1]


if __name__ == "__main__":
    print(json.dumps(publish_events(*arguments(sys.argv))), flush=True)
