"""A project of its own that a mixed fleet runs: the same code served by workers of two
releases of the layer (``celery -A tasks worker -Q fleet_payments`` in this folder, from
either runtime's Python).

One job, ``fleet.apply_event.v1``, applies a payment event to its order in the run's
PostgreSQL database (the chaos suite's shop schema: ``tests.acceptance.support_chaos``
counts lost and duplicated effects there) under the layer's ``once()`` marker, which
commits with the payment. After the commit it counts which runtime ran the job and
which runtime published it (odd events: the old publisher, even ones: the new), in the
store's Redis, so that the test can show that each side ran the other's jobs.
"""

from __future__ import annotations

import os

import redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from conventions import App, Id, JobContext, Payload, PermanentError
from conventions.transactional.once import once

app = App("fleet")
app.config_from_object("celeryconfig")

#: which runtime this process is (``old`` or ``new``): set by the test per worker
RUNTIME = os.environ.get("FLEET_RUNTIME", "unknown")
#: the counters of who ran whose jobs: ``fleet:ran:<runtime>:<publisher>``
RAN = "fleet:ran:{runtime}:{publisher}"

_engines: dict[int, Engine] = {}


def _engine() -> Engine:
    """This process's engine (a forked pool process makes its own)."""
    pid = os.getpid()
    if pid not in _engines:
        url = os.environ["FLEET_DATABASE_URL"]
        _engines[pid] = create_engine(url, pool_size=1, max_overflow=0)
    return _engines[pid]


def publisher_of(event_id: str) -> str:
    """Odd events are published by the old runtime, even ones by the new."""
    return "old" if int(event_id.removeprefix("evt_")) % 2 else "new"


class Event(Payload):
    event_id: Id


@app.job("fleet.apply_event.v1", payload=Event, key="fleet:{event_id}", workload="payments")
def apply_event(payload: Event, ctx: JobContext) -> str:
    """Apply the event to its order, once: marker and payment commit together."""
    with Session(_engine()) as session, session.begin():
        if not once(session, ctx.idempotency_key):
            return "already applied"
        event = session.execute(
            text(
                "UPDATE payment_events SET applied_at = coalesce(applied_at, now()) "
                "WHERE id = :id RETURNING order_id, amount_minor"
            ),
            {"id": payload.event_id},
        ).one_or_none()
        if event is None:
            raise PermanentError(f"unknown payment event {payload.event_id}")
        session.execute(
            text("UPDATE orders SET paid_minor = paid_minor + :amount WHERE id = :order"),
            {"amount": event.amount_minor, "order": event.order_id},
        )
    with redis.Redis.from_url(os.environ["FLEET_STORE_URL"]) as client:
        client.incr(RAN.format(runtime=RUNTIME, publisher=publisher_of(payload.event_id)))
    return "applied"
