"""The transactional outbox: enqueue a job in the same transaction as the data it is about.

``.delay()`` talks to the broker at once, outside the web app's transaction: the order can
commit and the process die before the enqueue (the receipt never goes out), or the job can
be enqueued and the order then rolled back (a receipt for nothing). ``add`` instead writes
the job as a row of ``cc_outbox`` through the caller's own session or connection::

    with Session(engine) as session, session.begin():
        session.add(Order(id="ord_1", ...))
        outbox.add(session, send_receipt, order_id="ord_1")

The row commits or rolls back with the order. A relay process (``conventions outbox
relay``, see :mod:`conventions.transactional.relay`) publishes committed rows and marks them
published.

``add`` checks the call exactly like ``.delay()`` (same payload parse, same idempotency
key, same headers, the correlation context bound by web code included: both go through
``ConventionTask.prepare``), so a bad call raises at the call site and writes nothing.
Each row gets its Celery task id when it is added; every publish of the row uses it, so a
relay that dies between publishing and marking publishes the same task id again, which
enqueue dedup and the execution ledger absorb.

A row that keeps failing for its own reason (a payload the task no longer accepts, a
task the relay's app does not know) is dead-lettered after its attempts: a dead letter in
the layer's store, and ``failed_at`` set on the row, which the relay then leaves alone.

The table works on PostgreSQL and SQLite; the Django integration
(``conventions.contrib.django_outbox``) maps the same table.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from conventions.config import extras, formats

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.orm import Session
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the outbox") from exc

from conventions.errors import PayloadError
from conventions.jobs import decisions
from conventions.observability.deadletters import MAX_MESSAGE, scrub
from conventions.store.records import Category, DeadLetter, utcnow
from conventions.store.sql import UTCDateTime
from conventions.tracing import headers as hdr

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
    #: the relay gave up on the row (its attempts ran out) and dead-lettered it
    sa.Column("failed_at", UTCDateTime(), nullable=True),
)
#: the indexes' predicate: not published (dead rows included, so the indexes stay as made)
_pending = table.c.published_at.is_(None)
#: what the relay still has to publish: not published, not dead-lettered
_waiting = sa.and_(_pending, table.c.failed_at.is_(None))
#: a dead-lettered row
_dead = table.c.failed_at.is_not(None)
sa.Index("cc_outbox_due", table.c.next_attempt_at, postgresql_where=_pending, sqlite_where=_pending)
sa.Index(
    "cc_outbox_pending_age", table.c.created_at, postgresql_where=_pending, sqlite_where=_pending
)
sa.Index("cc_outbox_published_at", table.c.published_at)

Bind = Session | sa.Connection


def create_table(bind: sa.Engine | sa.Connection) -> None:
    """Create the outbox table and its indexes in the app's database (idempotent); add
    the columns a table made by an older version lacks (``failed_at``)."""
    metadata.create_all(bind, checkfirst=True)
    if isinstance(bind, sa.Engine):
        with bind.begin() as conn:
            _add_missing_columns(conn)
    else:
        _add_missing_columns(bind)


def _add_missing_columns(conn: sa.Connection) -> None:
    present = {column["name"] for column in sa.inspect(conn).get_columns(TABLE)}
    for column in table.c:
        if column.name not in present and column.nullable:
            kind = column.type.compile(dialect=conn.dialect)
            conn.execute(sa.text(f"ALTER TABLE {TABLE} ADD COLUMN {column.name} {kind}"))


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
    if formats.OUTBOX_ROW != 1:  # the row's version: absent at 1 (``formats.row_problem``)
        message_headers[formats.ROW_FIELD] = formats.OUTBOX_ROW
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
        "failed_at": None,
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

    #: rows not published yet (dead-lettered ones apart)
    pending: int
    #: pending rows whose last publish failed
    failing: int
    #: rows dead-lettered after their attempts (``conventions outbox dead``)
    dead: int
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
            "dead": self.dead,
            "published": self.published,
            "lag_seconds": round(self.lag, 3),
            "last_error": self.last_error,
        }


def lag(bind: sa.Engine | sa.Connection, now: datetime | None = None) -> float:
    """The outbox lag: the age in seconds of the oldest row not yet published (0 if none).

    A growing lag means the relay is down, the broker unreachable, or a row keeps failing.
    Dead-lettered rows do not count: their dead letter is the alarm.
    """
    if isinstance(bind, sa.Engine):
        with bind.connect() as conn:
            return lag(conn, now)
    oldest = bind.execute(sa.select(sa.func.min(table.c.created_at)).where(_waiting)).scalar()
    if oldest is None:
        return 0.0
    age: float = ((now or utcnow()) - oldest).total_seconds()
    return max(0.0, age)


def status(engine: sa.Engine) -> Status:
    """Counts, the lag and the latest error of the outbox."""
    with engine.connect() as conn:
        pending, failing, dead, published = conn.execute(
            sa.select(
                sa.func.count().filter(_waiting),
                sa.func.count().filter(_waiting, table.c.attempts > 0),
                sa.func.count().filter(_dead),
                sa.func.count().filter(table.c.published_at.is_not(None)),
            )
        ).one()
        last_error = conn.execute(
            sa.select(table.c.last_error)
            .where(_waiting, table.c.last_error.is_not(None))
            .order_by(table.c.next_attempt_at.desc())
            .limit(1)
        ).scalar()
        counts = (int(pending), int(failing), int(dead), int(published))
        return Status(*counts, lag(conn), last_error)


def purge(engine: sa.Engine, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete the rows published (or dead-lettered) longer than ``older_than`` ago; return
    how many. Pending rows are never purged, however old; a dead row's dead letter stays
    in the store under the store's own retention.
    """
    before = (now or utcnow()) - older_than
    with engine.begin() as conn:
        old = sa.or_(table.c.published_at < before, table.c.failed_at < before)
        deleted = conn.execute(sa.delete(table).where(old))
        return int(deleted.rowcount)


def dead_rows(engine: sa.Engine, limit: int = 100) -> list[Any]:
    """The dead-lettered rows, newest first (``conventions outbox dead``)."""
    with engine.connect() as conn:
        query = sa.select(table).where(_dead).order_by(table.c.failed_at.desc()).limit(limit)
        return list(conn.execute(query).all())


def category_of(exc: Exception) -> Category:
    """Why a row's publish failed for good: a bad payload or a task the app does not
    know is ``invalid``; else the decision table's category, ``bug`` when unclassified."""
    if isinstance(exc, PayloadError | LookupError):
        return Category.INVALID
    decision = decisions.DEFAULT_TABLE.decide(exc)
    return decision.category if isinstance(decision, decisions.DeadLetterDecision) else Category.BUG


def dead_letter_of(row: Any, exc: Exception, error: str, attempts: int) -> DeadLetter:
    """The dead letter of a row the relay gives up on: the row's job, as ``.delay()``
    would have published it, with the relay's last error. Its id is derived from the
    row's task id, so writing it again (a relay that died before marking) overwrites it."""
    now = utcnow()
    headers = dict(row.headers or {})
    return DeadLetter(
        id=uuid.uuid5(uuid.NAMESPACE_URL, f"cc-outbox:{row.task_id}").hex,
        task=row.task,
        task_id=row.task_id,
        category=category_of(exc),
        payload=dict(row.kwargs or {}),
        headers=headers,
        idempotency_key=row.idempotency_key,
        exc_type=type(exc).__qualname__,
        message=scrub(error, MAX_MESSAGE),
        traceback="",
        attempts=attempts,
        first_failed_at=now,
        last_failed_at=now,
        worker=f"outbox-relay@{socket.gethostname()}",
        correlation_id=headers.get(hdr.CORRELATION),
    )
