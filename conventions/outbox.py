"""The transactional outbox: enqueue a job in the same transaction as the data it is about.

``.delay()`` talks to the broker at once, outside the web app's transaction: the order can
commit and the process die before the enqueue (the receipt never goes out), or the job can
be enqueued and the order then rolled back (a receipt for nothing). ``add`` instead writes
the job as a row of ``cc_outbox`` through the caller's own session or connection::

    with Session(engine) as session, session.begin():
        session.add(Order(id="ord_1", ...))
        outbox.add(session, send_receipt, order_id="ord_1")

The row commits or rolls back with the order. A relay process (``conventions outbox
relay``, see :mod:`conventions.relay`) publishes committed rows and marks them published.

``add`` checks the call exactly like ``.delay()`` (same payload parse, same idempotency
key, same headers, the correlation context bound by web code included: both go through
``ConventionTask.prepare``), so a bad call raises at the call site and writes nothing.
Each row gets its Celery task id when it is added; every publish of the row uses it, so a
relay that dies between publishing and marking publishes the same task id again, which
enqueue dedup and the execution ledger absorb.

The table works on PostgreSQL and SQLite; the Django integration
(``conventions.django_outbox``) maps the same table.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from conventions.records import utcnow
from conventions.store.sql import UTCDateTime

if TYPE_CHECKING:
    from conventions.task import ConventionTask

#: the outbox table's name, shared with the Django model
TABLE = "cc_outbox"

metadata = sa.MetaData()

#: jsonb on PostgreSQL (as Django's JSONField), JSON text on SQLite
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

#: one row per job to publish; kept ``retention`` after it was published, then purged
table = sa.Table(
    TABLE,
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    #: the Celery task id every publish of this row uses
    sa.Column("task_id", sa.String(36), nullable=False, unique=True),
    sa.Column("task", sa.String(255), nullable=False),
    sa.Column("kwargs", _JSON, nullable=False),
    sa.Column("headers", _JSON, nullable=False),
    sa.Column("idempotency_key", sa.String(255), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    #: failed publish attempts so far
    sa.Column("attempts", sa.Integer(), nullable=False, default=0),
    #: the relay leaves the row alone until then (backoff after a failed publish)
    sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
    sa.Column("published_at", UTCDateTime(), nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
)
_pending = table.c.published_at.is_(None)
sa.Index("cc_outbox_due", table.c.next_attempt_at, postgresql_where=_pending, sqlite_where=_pending)
sa.Index(
    "cc_outbox_pending_age", table.c.created_at, postgresql_where=_pending, sqlite_where=_pending
)
sa.Index("cc_outbox_published_at", table.c.published_at)

Bind = Session | sa.Connection


def create_table(bind: sa.Engine | sa.Connection) -> None:
    """Create the outbox table and its indexes in the app's database (idempotent)."""
    metadata.create_all(bind, checkfirst=True)


def row_for(
    task: ConventionTask,
    kwargs: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    headers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The outbox row of a call, checked exactly like ``.delay()``.

    Raises ``PayloadError`` for a bad call. The Django integration writes this same row.
    """
    options: dict[str, Any] = {"headers": headers}
    if idempotency_key:
        options["idempotency_key"] = idempotency_key
    data, key, message_headers = task.prepare(kwargs, options)
    now = utcnow()
    return {
        "task_id": str(uuid.uuid4()),
        "task": task.name,
        "kwargs": data,
        "headers": message_headers,
        "idempotency_key": key,
        "created_at": now,
        "attempts": 0,
        "next_attempt_at": now,
        "published_at": None,
        "last_error": None,
    }


def add(bind: Bind, task: ConventionTask, /, **payload: Any) -> str:
    """Add a job to the outbox in the caller's transaction; return its task id.

    ``bind`` is the SQLAlchemy ``Session`` or ``Connection`` of the transaction the job
    must commit with. The payload is checked like ``task.delay(**payload)``: a bad call
    raises ``PayloadError`` and writes nothing.
    """
    return add_call(bind, task, payload)


def add_call(
    bind: Bind,
    task: ConventionTask,
    kwargs: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    headers: dict[str, Any] | None = None,
) -> str:
    """``add`` with ``apply_async``'s options: an explicit idempotency key, extra headers."""
    row = row_for(task, kwargs, idempotency_key=idempotency_key, headers=headers)
    bind.execute(sa.insert(table).values(row))
    return str(row["task_id"])


@dataclass(frozen=True)
class Status:
    """The outbox at a glance (``conventions outbox status``)."""

    #: rows not published yet
    pending: int
    #: pending rows whose last publish failed
    failing: int
    #: published rows kept until the retention purges them
    published: int
    #: age of the oldest pending row in seconds (0 when none is pending)
    lag: float
    #: the last error of the most recently failed pending row
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "failing": self.failing,
            "published": self.published,
            "lag_seconds": round(self.lag, 3),
            "last_error": self.last_error,
        }


def lag(bind: sa.Engine | sa.Connection, now: datetime | None = None) -> float:
    """The outbox lag: the age in seconds of the oldest row not yet published (0 if none).

    A growing lag means the relay is down, the broker unreachable, or a row keeps failing.
    """
    if isinstance(bind, sa.Engine):
        with bind.connect() as conn:
            return lag(conn, now)
    oldest = bind.execute(sa.select(sa.func.min(table.c.created_at)).where(_pending)).scalar()
    if oldest is None:
        return 0.0
    age: float = ((now or utcnow()) - oldest).total_seconds()
    return max(0.0, age)


def status(engine: sa.Engine) -> Status:
    """Counts, the lag and the latest error of the outbox."""
    with engine.connect() as conn:
        pending, failing, published = conn.execute(
            sa.select(
                sa.func.count().filter(_pending),
                sa.func.count().filter(_pending, table.c.attempts > 0),
                sa.func.count().filter(table.c.published_at.is_not(None)),
            )
        ).one()
        last_error = conn.execute(
            sa.select(table.c.last_error)
            .where(_pending, table.c.last_error.is_not(None))
            .order_by(table.c.next_attempt_at.desc())
            .limit(1)
        ).scalar()
        return Status(int(pending), int(failing), int(published), lag(conn), last_error)


def purge(engine: sa.Engine, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete the rows published longer than ``older_than`` ago; return how many.

    Pending rows are never purged, however old.
    """
    before = (now or utcnow()) - older_than
    with engine.begin() as conn:
        deleted = conn.execute(sa.delete(table).where(table.c.published_at < before))
        return int(deleted.rowcount)
