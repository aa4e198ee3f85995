"""A test-only app on RabbitMQ's quorum queues, built by ``reliable()``: its queues are
``q26_``-prefixed (its poison queue too) and deleted by the tests that use them.

A worker subprocess loads it (``celery -A tests.integration.support_rabbit_quorum:app
worker -Q q26_jobs``). Each job writes what it saw into the store's Redis database, so a
test reads effects, not log lines. The layer's poison detection is set far away
(``conventions_max_deliveries``) and the broker's delivery limit low, so that a crash
pill reaches RabbitMQ's limit, the path under test.
"""

from __future__ import annotations

import os
import signal
import time

import redis

from conventions import App, Id, JobContext, Payload
from conventions.config.profile import reliable

#: the RabbitMQ the tests run against (a vhost of its own on a shared machine)
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
STORE_URL = os.environ["CONVENTIONS_STORE_URL"]
#: the worker's queue, a queue nobody consumes (the tests take its messages by hand),
#: the crash pills' queue, the default queue (plain tasks) and the poison queue
JOBS, SIDE, PILLS = "q26_jobs", "q26_side", "q26_pills"
DEFAULT, POISON = "q26_default", "q26_poison"
QUEUES = (JOBS, SIDE, PILLS, DEFAULT, POISON)
#: the broker's delivery limit here: a pill is delivered LIMIT + 1 times, then poison
LIMIT = 2
#: the store database's keys of the jobs' effects
PREFIX = "q26"

app = App("q26_quorum", set_as_current=False)
app.conf.update(
    reliable(broker_url=AMQP_URL, store_url=STORE_URL, result_backend=STORE_URL),
    conventions_workloads={"quorum": JOBS, "side": SIDE, "pill": PILLS},
    # a pill's lease lapses before its worker is started again: each delivery is claimed
    conventions_lease_seconds=1,
    task_default_queue=DEFAULT,
    conventions_poison_queue=POISON,
    conventions_delivery_limit=LIMIT,
    conventions_max_deliveries=50,
    conventions_retention_enabled=False,
    # the machine's Redis is a throwaway one (no persistence): said, not refused
    conventions_doctor_levels={"redis-no-persistence": "warning"},
)


def effects() -> redis.Redis:
    return redis.Redis.from_url(STORE_URL, socket_timeout=5)


class Item(Payload):
    item_id: Id


@app.job("testing.q26_ran.v1", payload=Item, key="q26r:{item_id}", workload="quorum")
def ran(payload: Item, ctx: JobContext) -> str:
    """Note when it ran (a float of ``time.time()``) and how many times."""
    client = effects()
    client.rpush(f"{PREFIX}:ran:{payload.item_id}", repr(time.time()))
    client.close()
    return payload.item_id


@app.job("testing.q26_side.v1", payload=Item, key="q26s:{item_id}", workload="side")
def sided(payload: Item, ctx: JobContext) -> str:
    return payload.item_id


@app.job("testing.q26_pill.v1", payload=Item, key="q26p:{item_id}", workload="pill")
def pill(payload: Item, ctx: JobContext) -> None:
    """Kill the whole worker that runs it (its main process, then itself), every time:
    the delivery is never acked, and RabbitMQ counts it back."""
    client = effects()
    client.rpush(f"{PREFIX}:pill:{payload.item_id}", repr(time.time()))
    client.close()
    os.kill(os.getppid(), signal.SIGKILL)
    os._exit(1)
