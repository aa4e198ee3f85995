"""Idempotency end to end (docs/howto/idempotency.md): a key per effect, enqueue dedup,
the ledger, ``once()`` for the app's own rows, and the provider's idempotency key."""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa
from sqlalchemy.orm import Session

from conventions import Id, JobContext, Payload
from conventions.transactional.once import create_table, once
from examples.howto.app import app

metadata = sa.MetaData()
#: one row per payment applied: inserting twice would count the money twice
entries = sa.Table(
    "example_payment_entries",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("event_id", sa.String(64), nullable=False),
    sa.Column("order_id", sa.String(64), nullable=False),
)


@cache
def database() -> sa.Engine:
    """The app's own database (the reference config's ``shop_database_url``)."""
    engine = sa.create_engine(app.conf.shop_database_url)
    metadata.create_all(engine)
    create_table(engine)  # cc_processed_jobs, the table of once(); a migration in production
    return engine


class PaymentEvent(Payload):
    """A provider's webhook event: its id names the effect."""

    event_id: Id
    order_id: Id


@app.job(
    "payments.apply_webhook.v1",
    payload=PaymentEvent,
    key="payment-event:{event_id}",  # the same event is the same effect
    workload="email",
    dedup="forever",  # providers resend webhooks for days: never publish one twice
)
def apply_webhook(payload: PaymentEvent, ctx: JobContext) -> str:
    with Session(database()) as session, session.begin():
        if not once(session, ctx.idempotency_key):  # INSERT .. ON CONFLICT DO NOTHING
            return "already applied"
        session.execute(
            entries.insert().values(event_id=payload.event_id, order_id=payload.order_id)
        )
    return "applied"  # the marker row and the effect committed together, or neither did
