"""``python -m bench``: publish cost of a convention task vs a raw Celery task.

Both publish the same id-only kwargs to the same Redis, interleaved A/B/A/B, with the
reliable profile on both apps; nothing consumes (the queues are emptied between rounds).
Prints the median time per ``.delay()`` of each and their ratio (raw / conventions: the
target is >= 0.85).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

DB = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
os.environ["REDIS_URL"] = DB
os.environ["CONVENTIONS_STORE_URL"] = DB
os.environ.pop("CELERY_BROKER_URL", None)

import redis  # noqa: E402
from celery import Celery  # noqa: E402

from tasks import app  # noqa: E402
from tasks.receipts import send_receipt  # noqa: E402

raw = Celery("raw", broker=DB, backend=DB)
raw.config_from_object("celeryconfig")


@raw.task(name="raw.send_receipt")
def raw_send_receipt(order_id: str) -> None:
    """The same job without the layer (never run here)."""


def timed(publish: Callable[[str], object], n: int) -> float:
    """Seconds per publish over ``n`` publishes with fresh ids."""
    ids = [f"ord_{uuid.uuid4().hex[:12]}" for _ in range(n)]
    start = time.perf_counter()
    for order_id in ids:
        publish(order_id)
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--n", type=int, default=500, help="publishes per measurement")
    args = parser.parse_args()
    client = redis.Redis.from_url(DB)
    client.flushdb()
    ours, theirs = [], []
    timed(lambda o: send_receipt.delay(order_id=o), 50)  # warm both connections
    timed(lambda o: raw_send_receipt.delay(order_id=o), 50)
    for _ in range(args.pairs):
        ours.append(timed(lambda o: send_receipt.delay(order_id=o), args.n))
        theirs.append(timed(lambda o: raw_send_receipt.delay(order_id=o), args.n))
        client.flushdb()
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"publish  conventions {a * 1e6:8.1f} us/job   raw celery {b * 1e6:8.1f} us/job")
    print(f"publish  ratio raw/conventions = {b / a:.2f}  (target >= 0.85; {args.pairs} pairs)")
    client.flushdb()
    client.close()
    app.store.close()


if __name__ == "__main__":
    main()
