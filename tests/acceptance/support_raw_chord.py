"""Raw Celery's chord, for comparison with a batch under the same blows.

A chord of ``raw.chord_item`` (2,000 headers) and ``raw.chord_done`` (its body) on the
chaos Redis: the broker in db 0, Celery's Redis result backend (where the chord's
counter lives) in db 3. The settings are the reliable delivery ones (late acks, reject on
worker lost, prefetch 1, the chaos suite's short visibility timeout), as
``support_raw``'s ``acks_late`` profile; no layer. Each body run is recorded in db 2
with how many results it got.

Started as ``celery -A tests.acceptance.support_raw_chord worker -Q celery``; submits
with ``python -m tests.acceptance.support_raw_chord <key> <count>``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import redis
from celery import Celery, chord

BASE = os.environ["REDIS_URL"].rsplit("/", 1)[0]
#: the list each body run is recorded in: ``<prefix><key>``
RUNS = "raw-chord-runs:"

app = Celery("raw_chord", broker=f"{BASE}/0", backend=f"{BASE}/3")
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": int(os.environ.get("CONVENTIONS_VISIBILITY_TIMEOUT", "10")),
        "unacked_restore_interval": 2,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": 5,
    },
)


@app.task(name="raw.chord_item")
def chord_item(n: int) -> int:
    time.sleep(0.005)
    return n


@app.task(name="raw.chord_done")
def chord_done(results: list[int], key: str) -> int:
    record = redis.Redis.from_url(f"{BASE}/2", decode_responses=True)
    record.rpush(RUNS + key, json.dumps({"results": len(results), "distinct": len(set(results))}))
    return len(results)


if __name__ == "__main__":
    key, count = sys.argv[1], int(sys.argv[2])
    chord(chord_item.s(n) for n in range(count))(chord_done.s(key))
    print(f"submitted a chord of {count}", flush=True)
