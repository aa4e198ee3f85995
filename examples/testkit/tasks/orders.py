"""Placing an order: the order row and its receipt job in one transaction (the outbox)."""

from __future__ import annotations

import sqlalchemy as sa
from conventions.transactional import outbox

from tasks.receipts import send_receipt

metadata = sa.MetaData()
orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("customer_id", sa.String(64), nullable=False),
)


def create_tables(engine: sa.Engine) -> None:
    metadata.create_all(engine)
    outbox.create_table(engine)


def place_order(conn: sa.Connection, order_id: str, customer_id: str) -> None:
    """Insert the order and its receipt job; both commit or roll back together."""
    conn.execute(orders.insert().values(id=order_id, customer_id=customer_id))
    outbox.add(conn, send_receipt, order_id=order_id, customer_id=customer_id)
