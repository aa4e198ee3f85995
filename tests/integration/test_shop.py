"""The reference shop's database, against real PostgreSQL and SQLite.

PostgreSQL: ``TEST_POSTGRES_URL`` (a server URL as ``tests/conftest.py`` reads it, database
``test`` then, or a full URL); every test gets a schema of its own (``shop_<random>``,
dropped afterwards), selected with ``search_path``. SQLite: a file under ``tmp_path``.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, create_engine, inspect, make_url, select, text
from sqlalchemy.exc import IntegrityError, OperationalError, StatementError
from sqlalchemy.orm import Session, sessionmaker

from tasks.shop import (
    Customer,
    DailyReport,
    Order,
    PaymentEvent,
    SentEmail,
    apply_payment,
    count_rows,
    create_schema,
    make_engine,
    normalise_url,
    seed,
    session_factory,
)
from tests.fixtures import unavailable


def _postgres_url() -> str:
    """``TEST_POSTGRES_URL``, a server URL as tests/conftest.py reads it (database ``test``
    then) or a full URL with its database."""
    url = make_url(
        normalise_url(os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432"))
    )
    if not url.database:
        url = url.set(database="test")
    return url.render_as_string(hide_password=False)


POSTGRES_URL = _postgres_url()
TABLES = {"customers", "orders", "payment_events", "daily_reports", "sent_emails"}
DAY = date(2024, 3, 1)


@pytest.fixture(scope="module")
def postgres_admin() -> Iterator[Engine]:
    engine = create_engine(normalise_url(POSTGRES_URL), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as exc:
        engine.dispose()
        unavailable(f"PostgreSQL at {POSTGRES_URL} (set TEST_POSTGRES_URL)", exc)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        sqlite_engine = make_engine(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
        yield sqlite_engine
        sqlite_engine.dispose()
        return

    admin: Engine = request.getfixturevalue("postgres_admin")
    schema = f"shop_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    pg_engine = make_engine(POSTGRES_URL, connect_args={"options": f"-csearch_path={schema}"})
    try:
        yield pg_engine
    finally:
        pg_engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    create_schema(engine)
    return session_factory(engine)


def seeded(sessions: sessionmaker[Session], **kwargs: int) -> None:
    with sessions() as session, session.begin():
        seed(session, business_date=DAY, **kwargs)


# -- schema ------------------------------------------------------------------------------


def test_create_schema_creates_every_shop_table(engine: Engine) -> None:
    create_schema(engine)

    assert set(inspect(engine).get_table_names()) >= TABLES


def test_create_schema_twice_keeps_existing_tables_and_rows(
    sessions: sessionmaker[Session], engine: Engine
) -> None:
    seeded(sessions)

    create_schema(engine)

    with sessions() as session:
        assert count_rows(session, Order) == 10


def test_several_processes_creating_the_schema_at_once_all_succeed(engine: Engine) -> None:
    creators = 6
    start = threading.Barrier(creators)
    errors: list[BaseException] = []

    def create() -> None:
        try:
            start.wait(timeout=30)
            create_schema(engine)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(creators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert set(inspect(engine).get_table_names()) >= TABLES


def test_sent_email_message_id_cannot_be_recorded_twice(sessions: sessionmaker[Session]) -> None:
    with sessions() as session, session.begin():
        session.add(
            SentEmail(order_id="ord_0001", message_id="<m1@shop>", recipient="a@b.c", subject="s")
        )

    with sessions() as session:
        session.add(
            SentEmail(order_id="ord_0001", message_id="<m1@shop>", recipient="a@b.c", subject="s")
        )
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
        assert count_rows(session, SentEmail) == 1


def test_timestamps_read_back_timezone_aware_in_utc(sessions: sessionmaker[Session]) -> None:
    paris = datetime(2024, 3, 1, 12, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Paris"))
    with sessions() as session, session.begin():
        session.add(
            DailyReport(
                business_date=DAY, orders=1, revenue_minor=100, rows_counted=1, created_at=paris
            )
        )

    with sessions() as session:
        report = session.execute(select(DailyReport)).scalar_one()
        assert report.created_at == datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
        assert report.created_at.utcoffset() == timedelta(0)


def test_naive_datetimes_are_refused(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        session.add(
            DailyReport(
                business_date=DAY,
                orders=0,
                revenue_minor=0,
                rows_counted=0,
                created_at=datetime(2024, 3, 1, 12, 0),
            )
        )
        with pytest.raises(StatementError, match="naive datetime"):
            session.flush()
        session.rollback()


# -- seed --------------------------------------------------------------------------------


def test_seed_adds_the_requested_customers_orders_and_events(
    sessions: sessionmaker[Session],
) -> None:
    seeded(sessions, customers=3, orders=10, events_per_order=2)

    with sessions() as session:
        assert count_rows(session, Customer) == 3
        assert count_rows(session, Order) == 10
        assert count_rows(session, PaymentEvent) == 20
        order_ids = session.scalars(select(Order.id).order_by(Order.id)).all()
        assert order_ids[0] == "ord_0001"
        assert order_ids[-1] == "ord_0010"
        assert session.get(Customer, "cus_0001") is not None
        assert session.get(PaymentEvent, "evt_0001") is not None


def test_seeded_orders_are_pending_integer_amounts_created_on_the_business_date(
    sessions: sessionmaker[Session],
) -> None:
    seeded(sessions, orders=10)

    with sessions() as session:
        for order in session.scalars(select(Order)):
            assert order.status == "pending"
            assert order.paid_minor == 0
            assert isinstance(order.amount_minor, int)
            assert order.amount_minor > 0
            assert order.currency == "EUR"
            assert order.created_at.tzinfo is not None
            assert order.created_at.astimezone(UTC).date() == DAY


def test_seeded_events_of_an_order_add_up_to_its_amount(sessions: sessionmaker[Session]) -> None:
    seeded(sessions, orders=5, events_per_order=3)

    with sessions() as session:
        for order in session.scalars(select(Order)):
            events = session.scalars(
                select(PaymentEvent).where(PaymentEvent.order_id == order.id)
            ).all()
            assert len(events) == 3
            assert sum(event.amount_minor for event in events) == order.amount_minor
            assert all(event.applied_at is None for event in events)
            assert all(event.kind == "payment" for event in events)


def test_seed_is_deterministic(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    other = make_engine(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    try:
        create_schema(other)
        seeded(sessions, orders=6, events_per_order=2)
        seeded(session_factory(other), orders=6, events_per_order=2)

        def snapshot(factory: sessionmaker[Session]) -> list[tuple[str, str, int, str]]:
            with factory() as session:
                rows = session.execute(
                    select(PaymentEvent.id, Order.id, PaymentEvent.amount_minor, Order.customer_id)
                    .join(Order, PaymentEvent.order_id == Order.id)
                    .order_by(PaymentEvent.id)
                ).all()
                return [(row[0], row[1], row[2], row[3]) for row in rows]

        assert snapshot(sessions) == snapshot(session_factory(other))
    finally:
        other.dispose()


def test_seeding_twice_does_not_duplicate_rows(sessions: sessionmaker[Session]) -> None:
    seeded(sessions, customers=3, orders=10, events_per_order=2)
    seeded(sessions, customers=3, orders=10, events_per_order=2)

    with sessions() as session:
        assert count_rows(session, Customer) == 3
        assert count_rows(session, Order) == 10
        assert count_rows(session, PaymentEvent) == 20


def test_seeding_again_leaves_existing_rows_as_they_are(sessions: sessionmaker[Session]) -> None:
    seeded(sessions, orders=2)
    with sessions() as session, session.begin():
        apply_payment(session, "evt_0001")

    seeded(sessions, orders=2)

    with sessions() as session:
        order = session.get(Order, "ord_0001")
        assert order is not None
        assert order.status == "paid"
        assert order.paid_minor == order.amount_minor


def test_seeding_with_more_orders_adds_only_the_missing_ones(
    sessions: sessionmaker[Session],
) -> None:
    seeded(sessions, orders=10)
    seeded(sessions, orders=15)

    with sessions() as session:
        assert count_rows(session, Order) == 15
        assert count_rows(session, PaymentEvent) == 15
        assert count_rows(session, Customer) == 3


def test_seed_does_not_commit(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        seed(session, business_date=DAY)
        session.rollback()
        assert count_rows(session, Order) == 0


# -- apply_payment -----------------------------------------------------------------------


def test_applying_a_payment_adds_its_amount_and_marks_the_event_applied(
    sessions: sessionmaker[Session],
) -> None:
    seeded(sessions, orders=1, events_per_order=2)
    before = datetime.now(UTC)

    with sessions() as session, session.begin():
        order = apply_payment(session, "evt_0001")
        first = session.get(PaymentEvent, "evt_0001")
        assert first is not None
        assert order.paid_minor == first.amount_minor

    with sessions() as session:
        first = session.get(PaymentEvent, "evt_0001")
        second = session.get(PaymentEvent, "evt_0002")
        stored = session.get(Order, "ord_0001")
        assert first is not None
        assert second is not None
        assert stored is not None
        assert stored.paid_minor == first.amount_minor
        assert first.applied_at is not None
        assert first.applied_at >= before - timedelta(seconds=1)
        assert second.applied_at is None


def test_an_order_stays_pending_until_its_payments_cover_the_amount(
    sessions: sessionmaker[Session],
) -> None:
    seeded(sessions, orders=1, events_per_order=2)

    with sessions() as session, session.begin():
        order = apply_payment(session, "evt_0001")
        assert order.status == "pending"
        assert 0 < order.paid_minor < order.amount_minor

    with sessions() as session, session.begin():
        order = apply_payment(session, "evt_0002")
        assert order.status == "paid"
        assert order.paid_minor == order.amount_minor


def test_applying_an_event_twice_adds_it_twice_so_the_duplicate_is_visible(
    sessions: sessionmaker[Session],
) -> None:
    seeded(sessions, orders=1, events_per_order=1)

    with sessions() as session, session.begin():
        apply_payment(session, "evt_0001")
    with sessions() as session, session.begin():
        first_applied = session.get(PaymentEvent, "evt_0001")
        assert first_applied is not None
        stamp = first_applied.applied_at
        order = apply_payment(session, "evt_0001")

    assert order.paid_minor == 2 * order.amount_minor
    assert order.status == "paid"
    with sessions() as session:
        event = session.get(PaymentEvent, "evt_0001")
        assert event is not None
        assert event.applied_at == stamp


def test_applying_an_unknown_event_raises_lookup_error(sessions: sessionmaker[Session]) -> None:
    seeded(sessions, orders=1)

    with sessions() as session, pytest.raises(LookupError, match="evt_9999"):
        apply_payment(session, "evt_9999")


def test_apply_payment_leaves_the_commit_to_the_caller(sessions: sessionmaker[Session]) -> None:
    seeded(sessions, orders=1)

    with sessions() as session:
        order = apply_payment(session, "evt_0001")
        assert order.status == "paid"
        session.rollback()

    with sessions() as session:
        order_after = session.get(Order, "ord_0001")
        event = session.get(PaymentEvent, "evt_0001")
        assert order_after is not None
        assert event is not None
        assert order_after.paid_minor == 0
        assert order_after.status == "pending"
        assert event.applied_at is None


def test_concurrent_payments_on_one_order_lose_no_update(sessions: sessionmaker[Session]) -> None:
    parts = 8
    seeded(sessions, orders=1, events_per_order=parts)
    start = threading.Barrier(parts)
    errors: list[BaseException] = []

    def pay(event_id: str) -> None:
        try:
            start.wait(timeout=30)
            with sessions() as session, session.begin():
                apply_payment(session, event_id)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=pay, args=(f"evt_{number:04d}",)) for number in range(1, parts + 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    with sessions() as session:
        order = session.get(Order, "ord_0001")
        assert order is not None
        assert order.paid_minor == order.amount_minor
        assert order.status == "paid"


# -- engines -----------------------------------------------------------------------------


def test_sqlite_engine_uses_wal_a_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'wal.sqlite3'}")
    try:
        with engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
            assert connection.execute(text("PRAGMA busy_timeout")).scalar_one() >= 5000
            assert connection.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://shop:shop@db:5432/shop", "postgresql+psycopg://shop:shop@db:5432/shop"),
        ("postgres://shop:shop@db/shop", "postgresql+psycopg://shop:shop@db/shop"),
        ("postgresql+psycopg://u@h/d", "postgresql+psycopg://u@h/d"),
        ("sqlite:///.demo/shop.sqlite3", "sqlite:///.demo/shop.sqlite3"),
    ],
)
def test_postgres_urls_are_normalised_to_psycopg_3(given: str, expected: str) -> None:
    assert normalise_url(given) == expected
