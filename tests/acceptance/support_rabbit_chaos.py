"""The RabbitMQ chaos run's app, publisher and crew.

An app of its own, built from ``reliable(broker_url=<a private RabbitMQ node>)`` (so its
workload queue is what the profile makes of RabbitMQ: quorum, with a delivery limit and
dead-lettering to the layer's poison queue), its store and results on the chaos Redis
(``support_chaos.RedisServer``), and one job: ``testing.cc_chaos_pay.v1`` applies a
payment event to its order in the chaos PostgreSQL database, under a ``once()`` marker,
exactly like ``payments.apply_event.v1`` (so ``support_chaos.measure`` counts lost and
duplicated effects). ``testing.cc_chaos_pill.v1`` kills the pool process that runs it,
on every delivery.

The app reads its servers from the environment (:func:`env_for`); worker subprocesses
load it with ``-A tests.acceptance.support_rabbit_chaos:app``, the publisher runs this
module (``python -m tests.acceptance.support_rabbit_chaos publish 2000``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from conventions import App, Id, JobContext, Payload, PermanentError
from conventions.config.profile import reliable
from conventions.transactional.once import once
from tasks import shop
from tests.acceptance.chaos_runs import Crew
from tests.acceptance.support_chaos import INHERITED_NOT, ROOT, RedisServer, Worker, event_ids

#: the queue of the run (the node is the test's own: no other run's queue is there)
QUEUE = "cc_chaos_payments"
POISON_QUEUE = "cc_chaos_poison"
APP = "tests.acceptance.support_rabbit_chaos:app"
#: the layer's claims before a job is quarantined as poison (the default, said here)
MAX_DELIVERIES = 3
#: the ledger's lease (seconds): a killed holder's key is free again this soon
LEASE = 3.0

app = App("cc_rabbit_chaos", set_as_current=False)
app.conf.update(
    reliable(
        broker_url=os.environ.get("CC_CHAOS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5680//"),
        store_url=os.environ.get("CC_CHAOS_STORE_URL", "redis://127.0.0.1:6379/1"),
        result_backend=os.environ.get("CC_CHAOS_RESULTS_URL", "redis://127.0.0.1:6379/0"),
    ),
    task_default_queue="cc_chaos_default",
    conventions_workloads={"payments": QUEUE},
    conventions_poison_queue=POISON_QUEUE,
    conventions_lease_seconds=LEASE,
    conventions_max_deliveries=MAX_DELIVERIES,
)

_engines: dict[int, Engine] = {}


def _engine() -> Engine:
    """The chaos database's engine of this process (a forked pool process makes its own)."""
    pid = os.getpid()
    if pid not in _engines:
        _engines[pid] = shop.make_engine(os.environ["CC_CHAOS_DATABASE_URL"])
    return _engines[pid]


class Event(Payload):
    event_id: Id


class Pill(Payload):
    pill_id: Id


@app.job("testing.cc_chaos_pay.v1", payload=Event, key="ccpay:{event_id}", workload="payments")
def pay(payload: Event, ctx: JobContext) -> str:
    """Apply the event once: the ``once()`` marker commits with the payment."""
    with shop.session_factory(_engine())() as session, session.begin():
        if session.get(shop.PaymentEvent, payload.event_id) is None:
            raise PermanentError(f"unknown payment event {payload.event_id}")
        if not once(session, ctx.idempotency_key):
            return "already applied"
        shop.apply_payment(session, payload.event_id)
    return "applied"


@app.job("testing.cc_chaos_pill.v1", payload=Pill, key="ccpill:{pill_id}", workload="payments")
def pill(payload: Pill, ctx: JobContext) -> None:
    """SIGKILL the pool process running this job, on every delivery (a crash pill)."""
    os.kill(os.getpid(), signal.SIGKILL)


def env_for(amqp_url: str, server: RedisServer, engine: Engine) -> dict[str, str]:
    """The environment of the run's workers and publishers."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_NOT}
    env.update({
        "PYTHONPATH": str(ROOT),
        "CC_CHAOS_AMQP_URL": amqp_url,
        "CC_CHAOS_STORE_URL": server.url(1),
        "CC_CHAOS_RESULTS_URL": server.url(0),
        "CC_CHAOS_DATABASE_URL": engine.url.render_as_string(hide_password=False),
    })  # fmt: skip
    return env


class RabbitCrew(Crew):
    """Two live workers of the RabbitMQ app; every blow is followed by a replacement."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        super().__init__("ours", env, folder)
        self.queue = QUEUE

    def _start_one(self) -> None:
        with self.lock:
            name = f"rabbit-{len(self.all) + 1}"
            worker = Worker(APP, name, self.queue, self.env, self.folder)
            self.all.append(worker)
        worker.wait_ready()
        with self.lock:
            self.live.append(worker)


def _publish(count: int) -> None:
    for event_id in event_ids(count):
        pay.delay(event_id=event_id)
    print(f"published {count}", flush=True)


def _publish_through(count: int, delayed: int, pace: float) -> None:
    """Publish ``count`` events one by one, ``pace`` seconds apart (so that publishes go on
    while nodes die and leaders are elected), the first ``delayed`` with a countdown of 10
    to 60 s (they wait in ``celery_delayed_*`` while nodes die), as a caller told of a
    refusal does: a ``.delay()`` that raised is said (``refused``) and made again until
    RabbitMQ confirms it. A publish that returned is a confirmed one. The countdowns
    outlast the start of the workers and the first blow: delays wait through it."""
    refused = 0
    for number, event_id in enumerate(event_ids(count)):
        options: dict[str, Any] = {"countdown": 10 + number % 51} if number < delayed else {}
        while True:
            try:
                pay.apply_async(kwargs={"event_id": event_id}, **options)
                time.sleep(pace)
                break
            except Exception as exc:  # the caller is told: it tries again
                refused += 1
                print(f"refused {event_id}: {type(exc).__name__}: {exc}", flush=True)
                time.sleep(0.5)
    print(f"published {count} ({delayed} delayed), {refused} refused and made again",
          flush=True)  # fmt: skip


def _publish_pill(pill_id: str) -> None:
    print(pill.delay(pill_id=pill_id).id, flush=True)


def main(argv: list[str]) -> Any:
    if argv[1] == "publish":
        return _publish(int(argv[2]))
    if argv[1] == "publish-through":
        return _publish_through(int(argv[2]), int(argv[3]), float(argv[4]))
    return _publish_pill(argv[2])


if __name__ == "__main__":
    main(sys.argv)
