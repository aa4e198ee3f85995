"""Business-level exactly once: a marker row committed with the business change.

The ledger stops a second *run*; only the app's own transaction can stop a second
*effect*. Inside that transaction, ``once(session, key)`` inserts a marker row into a
processed-jobs table (``INSERT ... ON CONFLICT DO NOTHING``): the first caller gets
True and does the work; any later caller gets False. The marker and the business change
commit or roll back together, so a crash between them leaves neither.

    with Session(engine) as session, session.begin():
        if once(session, ctx.idempotency_key):
            apply_payment(session, payload.event_id)
"""

from __future__ import annotations

from datetime import UTC, datetime

from conventions.config import extras

try:
    from sqlalchemy import Column, DateTime, MetaData, String, Table
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.orm import Session
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "once()") from exc

metadata = MetaData()

#: one row per key that took effect
processed_jobs = Table(
    "cc_processed_jobs",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("processed_at", DateTime(timezone=True), nullable=False),
)


def create_table(bind: Engine | Connection) -> None:
    """Create the processed-jobs table in the app's database (idempotent)."""
    metadata.create_all(bind, checkfirst=True)


def once(session: Session, key: str) -> bool:
    """True the first time ``key`` is seen in a committed transaction, else False."""
    values = {"key": key, "processed_at": datetime.now(UTC)}
    dialect = session.get_bind().dialect.name
    stmt: postgresql.Insert | sqlite.Insert
    if dialect == "postgresql":
        stmt = postgresql.insert(processed_jobs).values(**values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        stmt = sqlite.insert(processed_jobs).values(**values).on_conflict_do_nothing()
    else:  # pragma: no cover - the two supported databases are above
        raise NotImplementedError(f"once() supports PostgreSQL and SQLite, not {dialect}")
    inserted = session.execute(stmt.returning(processed_jobs.c.key)).first()
    return inserted is not None
