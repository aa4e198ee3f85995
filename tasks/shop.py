"""The reference app's business database: a small shop (SQLAlchemy 2 ORM).

Customers place orders; payment events arrive and are applied to their order; a daily
report sums a business day; every confirmation e-mail sent is recorded under a
deterministic ``Message-ID`` so that a second send of the same mail is detectable.

Money is kept in integer minor units (``amount_minor``), never in floats; every
timestamp is timezone-aware UTC, on PostgreSQL and SQLite alike.

Nothing here reads the environment at import time: the URL is an argument, and only the
CLI (``python -m tasks.shop init|seed``) falls back to ``DATABASE_URL``.

Engines are not fork-safe: a Celery prefork worker must build its engine in the child
process (e.g. on ``worker_process_init``), never inherit one from the parent.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Date,
    DateTime,
    Dialect,
    Engine,
    ForeignKey,
    Integer,
    String,
    Table,
    case,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

__all__ = [
    "DEFAULT_CURRENCY",
    "DEFAULT_SQLITE_URL",
    "PAID",
    "PENDING",
    "SQLITE_BUSY_TIMEOUT_S",
    "Base",
    "Customer",
    "DailyReport",
    "DailyReportChunk",
    "Order",
    "PaymentEvent",
    "SentEmail",
    "UTCDateTime",
    "apply_payment",
    "count_rows",
    "create_schema",
    "main",
    "make_engine",
    "normalise_url",
    "seed",
    "session_factory",
    "utcnow",
]

#: where the CLI keeps the demo database when ``DATABASE_URL`` is not set
DEFAULT_SQLITE_URL = "sqlite:///.demo/shop.sqlite3"
#: how long a SQLite writer waits for another process's write lock before failing
SQLITE_BUSY_TIMEOUT_S = 30.0
#: the one currency the seeded shop sells in (a daily revenue adds up one currency)
DEFAULT_CURRENCY = "EUR"

#: the order statuses
PENDING = "pending"
PAID = "paid"

#: arbitrary, fixed key of the advisory lock that serialises concurrent ``create_schema``
_SCHEMA_LOCK_KEY = 0x73686F70  # "shop" in ASCII


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL keeps it as ``timestamptz``; SQLite, which has no time zones, keeps the
    UTC wall time and gets its ``tzinfo`` back on read. Naive datetimes are refused on
    write: they are ambiguous, and a silent guess is how reports end up an hour off.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):  # pragma: no cover - driver-specific
            value = datetime.fromisoformat(str(value))
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """The declarative base of the shop's tables (its own ``MetaData``)."""


class Customer(Base):
    __tablename__ = "customers"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "cus_0001"
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str] = mapped_column(String(320))

    def __repr__(self) -> str:
        return f"Customer(id={self.id!r}, email={self.email!r})"


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "ord_0001"
    customer_id: Mapped[str] = mapped_column(ForeignKey("customers.id"), index=True)
    #: the price, in integer minor units of ``currency`` (cents for EUR)
    amount_minor: Mapped[int] = mapped_column(Integer)
    currency: Mapped[str] = mapped_column(String(3))
    #: ``"pending"`` until the applied payments cover ``amount_minor``, then ``"paid"``
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    #: the sum of the payment events applied so far, in minor units
    paid_minor: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)

    def __repr__(self) -> str:
        return (
            f"Order(id={self.id!r}, amount_minor={self.amount_minor!r}, "
            f"paid_minor={self.paid_minor!r}, status={self.status!r})"
        )


class PaymentEvent(Base):
    __tablename__ = "payment_events"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "evt_0001"
    order_id: Mapped[str] = mapped_column(ForeignKey("orders.id"), index=True)
    amount_minor: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16), default="payment")
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    #: when the event was first applied to its order; None while it is not
    applied_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    def __repr__(self) -> str:
        return (
            f"PaymentEvent(id={self.id!r}, order_id={self.order_id!r}, "
            f"amount_minor={self.amount_minor!r}, applied_at={self.applied_at!r})"
        )


class DailyReport(Base):
    __tablename__ = "daily_reports"

    business_date: Mapped[date] = mapped_column(Date, primary_key=True)
    orders: Mapped[int] = mapped_column(Integer)
    revenue_minor: Mapped[int] = mapped_column(Integer)
    rows_counted: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class DailyReportChunk(Base):
    """One chunk of a day's report: the orders with ids in ``[first_id, last_id]``.

    Written in the same transaction as nothing else and keyed by its first id, so that a
    chunk counted again after a crash (before its checkpoint was saved) overwrites its
    own row: every order is counted exactly once. ``passes`` counts how often the chunk
    was computed (1 unless a crash repeated it).
    """

    __tablename__ = "daily_report_chunks"

    business_date: Mapped[date] = mapped_column(Date, primary_key=True)
    first_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_id: Mapped[str] = mapped_column(String(32))
    orders: Mapped[int] = mapped_column(Integer)
    revenue_minor: Mapped[int] = mapped_column(Integer)
    passes: Mapped[int] = mapped_column(Integer, default=1)


class SentEmail(Base):
    __tablename__ = "sent_emails"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(32), index=True)
    #: deterministic per (mail, order): a second send of the same mail breaks uniqueness
    message_id: Mapped[str] = mapped_column(String(255), unique=True)
    recipient: Mapped[str] = mapped_column(String(320))
    subject: Mapped[str] = mapped_column(String(255))
    sent_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


# -- engines and sessions ----------------------------------------------------------------


def normalise_url(url: str) -> str:
    """``postgres://`` and ``postgresql://`` -> ``postgresql+psycopg://`` (psycopg 3).

    Any other URL, an explicit driver included, is returned unchanged in meaning.
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        # WAL: readers never block the writer, and several processes can share the file
        # (an in-memory database answers "memory" and stays as it is).
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``, set up for several worker processes writing at once.

    SQLite: a busy timeout (the driver's ``timeout`` and ``PRAGMA busy_timeout``), WAL
    journal mode and foreign keys, on every new connection. PostgreSQL: psycopg 3 and
    ``pool_pre_ping`` (a broker outage or a database restart leaves dead connections).
    ``kwargs`` go to :func:`sqlalchemy.create_engine`; ``connect_args`` are merged.
    """
    url = normalise_url(url)
    backend = make_url(url).get_backend_name()
    connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", None) or {})
    if backend == "sqlite":
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, connect_args=connect_args, **kwargs)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def create_schema(engine: Engine) -> None:
    """Create the missing tables (existing ones are left as they are).

    Safe to run from several processes at once (every worker process does, on its first
    use of the database): the check-then-create runs under a lock, a transaction-scoped
    advisory lock on PostgreSQL and the database's write lock (``BEGIN IMMEDIATE``) on
    SQLite, so no two creators race to ``CREATE TABLE`` the same table.
    """
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY}
            )
        elif connection.dialect.name == "sqlite":
            # pysqlite runs DDL outside any transaction: take the write lock by hand;
            # the engine's commit ends this transaction (the driver checks the real state)
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        Base.metadata.create_all(connection)


# -- seed data ---------------------------------------------------------------------------


def _customer_id(number: int) -> str:
    return f"cus_{number:04d}"


def _order_id(number: int) -> str:
    return f"ord_{number:04d}"


def _event_id(number: int) -> str:
    return f"evt_{number:04d}"


def _order_amount_minor(number: int) -> int:
    """A deterministic price between 5.00 and 504.99 (minor units)."""
    return 500 + (number * 7919) % 50_000


def _split(amount_minor: int, parts: int) -> list[int]:
    """``amount_minor`` in ``parts`` integer instalments that add up to it exactly."""
    share, remainder = divmod(amount_minor, parts)
    return [share + (1 if index < remainder else 0) for index in range(parts)]


def _table(name: str) -> Table:
    return Base.metadata.tables[name]


def _insert_missing(session: Session, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert the rows whose primary key is not in ``table`` yet; keep the others as they are."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        session.execute(pg_insert(table).on_conflict_do_nothing(), list(rows))
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        session.execute(sqlite_insert(table).on_conflict_do_nothing(), list(rows))
    else:  # pragma: no cover - neither backend the project runs on
        key = table.c.id
        wanted = [row["id"] for row in rows]
        existing = set(session.scalars(select(key).where(key.in_(wanted))))
        missing = [row for row in rows if row["id"] not in existing]
        if missing:
            session.execute(insert(table), missing)


def seed(
    session: Session,
    customers: int = 3,
    orders: int = 10,
    events_per_order: int = 1,
    business_date: date | None = None,
    *,
    first: int = 1,
) -> None:
    """Add the demo shop's rows: deterministic ids and amounts, idempotent.

    ``customers`` customers ``cus_0001``..; ``orders`` pending orders ``ord_0001``..
    (order *n* belongs to customer ``((n - 1) % customers) + 1``, created on
    ``business_date`` in UTC, today by default); ``events_per_order`` unapplied payment
    events per order, ``evt_0001``.. in order, whose amounts add up to the order's.
    ``first`` numbers the orders from another start (``first=100_001``: ``ord_100001``..),
    so that a second day does not collide with the first one's ids.

    Rows already there (by id) are left untouched, so seeding twice adds nothing and
    seeding again with more ``orders`` adds only the new ones. Concurrent seeders do not
    collide (``INSERT .. ON CONFLICT DO NOTHING``). Does not commit: the caller does.
    """
    if customers < 1 or orders < 0 or events_per_order < 1 or first < 1:
        raise ValueError(
            "seed needs customers >= 1, orders >= 0, events_per_order >= 1 and first >= 1"
        )
    day = business_date if business_date is not None else utcnow().date()
    opening = datetime.combine(day, time(0, 0), tzinfo=UTC)

    customer_rows = [
        {
            "id": _customer_id(number),
            "name": f"Customer {number}",
            "email": f"customer{number}@example.com",
        }
        for number in range(1, customers + 1)
    ]
    order_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    for number in range(first, first + orders):
        amount = _order_amount_minor(number)
        # spread over the business day, never past its end
        created_at = opening + timedelta(seconds=(number * 97) % 86_400)
        order_id = _order_id(number)
        order_rows.append(
            {
                "id": order_id,
                "customer_id": _customer_id((number - 1) % customers + 1),
                "amount_minor": amount,
                "currency": DEFAULT_CURRENCY,
                "status": PENDING,
                "paid_minor": 0,
                "created_at": created_at,
            }
        )
        for index, instalment in enumerate(_split(amount, events_per_order)):
            event_rows.append(
                {
                    "id": _event_id((number - 1) * events_per_order + index + 1),
                    "order_id": order_id,
                    "amount_minor": instalment,
                    "kind": "payment",
                    "received_at": created_at + timedelta(minutes=index + 1),
                    "applied_at": None,
                }
            )

    _insert_missing(session, _table("customers"), customer_rows)
    _insert_missing(session, _table("orders"), order_rows)
    _insert_missing(session, _table("payment_events"), event_rows)


# -- queries -----------------------------------------------------------------------------


def count_rows(session: Session, model: type[Base]) -> int:
    """How many rows ``model``'s table holds (as this session's transaction sees it)."""
    return session.execute(select(func.count()).select_from(model)).scalar_one()


def apply_payment(session: Session, event_id: str) -> Order:
    """Apply the payment event ``event_id`` to its order and return the order, refreshed.

    Adds the event's amount to ``order.paid_minor`` and sets ``status`` to ``"paid"``
    once ``paid_minor >= amount_minor``, in one ``UPDATE`` evaluated by the database, so
    concurrent payments on one order lose no update (no read-then-write). Sets the
    event's ``applied_at`` (the first application's time is kept).

    Applying the same event twice adds its amount twice, on purpose: this is the
    non-idempotent side effect that the conventions' execution ledger must guard, and a
    double application shows as ``paid_minor`` above the sum of the order's events.

    Raises LookupError for an unknown event. Does not commit: the caller's transaction
    decides.
    """
    payment = session.get(PaymentEvent, event_id)
    if payment is None:
        raise LookupError(f"unknown payment event {event_id!r}")
    if payment.applied_at is None:
        payment.applied_at = utcnow()
    new_paid = Order.paid_minor + payment.amount_minor
    session.execute(
        update(Order)
        .where(Order.id == payment.order_id)
        .values(
            paid_minor=new_paid,
            status=case((new_paid >= Order.amount_minor, PAID), else_=Order.status),
        )
        .execution_options(synchronize_session=False)
    )
    order = session.get(Order, payment.order_id, populate_existing=True)
    if order is None:  # pragma: no cover - the foreign key forbids it
        raise LookupError(f"payment event {event_id!r} names unknown order {payment.order_id!r}")
    return order


# -- CLI ---------------------------------------------------------------------------------


def _ensure_sqlite_folder(url: str) -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(str(parsed.database)).parent.mkdir(parents=True, exist_ok=True)


def _parse_date(value: str) -> date:
    return date.fromisoformat(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tasks.shop", description="The reference shop's database."
    )
    parser.add_argument(
        "--url",
        default=None,
        help=f"database URL (default: $DATABASE_URL, else {DEFAULT_SQLITE_URL})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init", help="create the missing tables")
    seed_cmd = commands.add_parser("seed", help="create the tables and add the demo rows")
    seed_cmd.add_argument("--customers", type=int, default=3)
    seed_cmd.add_argument("--orders", type=int, default=10)
    seed_cmd.add_argument("--events-per-order", type=int, default=1)
    seed_cmd.add_argument("--first", type=int, default=1, help="number of the first order")
    seed_cmd.add_argument(
        "--date", type=_parse_date, default=None, help="business date, YYYY-MM-DD (default: today)"
    )
    # accept --url after the sub-command too (``seed --url ...``)
    for sub in (commands.choices["init"], seed_cmd):
        sub.add_argument("--url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m tasks.shop init|seed [--url URL] [--orders N]``."""
    args = _parser().parse_args(None if argv is None else list(argv))
    url: str = args.url or os.environ.get("DATABASE_URL") or DEFAULT_SQLITE_URL
    _ensure_sqlite_folder(url)
    engine = make_engine(url)
    try:
        create_schema(engine)
        if args.command == "seed":
            with session_factory(engine)() as session, session.begin():
                seed(
                    session,
                    customers=args.customers,
                    orders=args.orders,
                    events_per_order=args.events_per_order,
                    business_date=args.date,
                    first=args.first,
                )
        with session_factory(engine)() as session:
            counts = ", ".join(
                f"{model.__tablename__}={count_rows(session, model)}"
                for model in (Customer, Order, PaymentEvent, DailyReport, SentEmail)
            )
        shown = make_url(normalise_url(url)).render_as_string(hide_password=True)
        print(f"{args.command}: {shown}: {counts}")
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    # run the canonical module's main: ``tasks`` may have imported ``tasks.shop`` already,
    # and one set of model classes is better than two
    from tasks.shop import main as _main

    sys.exit(_main())
