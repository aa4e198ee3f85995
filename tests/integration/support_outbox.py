"""Helpers of the outbox tests: orders in the shop database, outbox rows, sent receipts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from conventions.transactional import outbox
from tasks import db, shop

ROOT = Path(__file__).resolve().parents[2]
#: a customer of the seeded shop (``shop.seed`` makes cus_0001..)
CUSTOMER = "cus_0001"


def reset_outbox() -> sa.Engine:
    """The shop database's engine, its outbox table created and emptied."""
    engine = db.engine()
    outbox.create_table(engine)
    with engine.begin() as conn:
        conn.execute(sa.delete(outbox.table))
    return engine


def new_order(session: Session, order_id: str, customer: str = CUSTOMER) -> shop.Order:
    """A paid order (what a checkout endpoint creates), added to ``session``."""
    order = shop.Order(
        id=order_id,
        customer_id=customer,
        amount_minor=1250,
        currency="EUR",
        status=shop.PAID,
        paid_minor=1250,
    )
    session.add(order)
    return order


def rows(engine: sa.Engine, **where: Any) -> list[Any]:
    """The outbox rows, oldest first, filtered by column equality."""
    t = outbox.table
    query = sa.select(t).order_by(t.c.id)
    for name, value in where.items():
        query = query.where(t.c[name] == value)
    with engine.connect() as conn:
        return list(conn.execute(query).all())


def receipts_sent(*order_ids: str) -> dict[str, int]:
    """How many receipts each order got (``sent_emails`` rows)."""
    t = shop.SentEmail.__table__
    with db.engine().connect() as conn:
        found = conn.execute(
            sa.select(t.c.order_id, sa.func.count())
            .where(t.c.order_id.in_(order_ids))
            .group_by(t.c.order_id)
        ).all()
    counts = {order_id: 0 for order_id in order_ids}
    counts.update({str(order_id): int(n) for order_id, n in found})
    return counts


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    """``conventions ARGS`` as a subprocess of the project (a real relay process)."""
    return subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
