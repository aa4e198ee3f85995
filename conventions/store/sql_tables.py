"""The SQL store's schema: its column type, its tables, the statement helpers every part
of :class:`~conventions.store.sql.SQLStore` uses (an upsert, the database's clock), and
the retention of the rows past their own expiry.

Table and index names carry the store's prefix (``cc_`` by default). The layer's other
tables (the outbox's, the relay's) use :class:`UTCDateTime` too, and import it from
:mod:`conventions.store.sql`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from conventions.config import extras

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.engine import Dialect
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the SQL store") from exc

#: rows one purge statement deletes at most (bounds each transaction and its locks)
EXPIRED_BATCH = 1000


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every dialect (naive input is taken as UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            value = datetime.fromisoformat(str(value))
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def later(postgres: bool, seconds: float) -> sa.ColumnElement[datetime]:
    """The database's clock plus ``seconds``, in the form the time columns keep.

    PostgreSQL: ``now()`` (the transaction's start) plus an interval. SQLite keeps naive
    UTC text with six fraction digits; its clock gives milliseconds (``%f``), padded to
    the same width so that text order stays time order.
    """
    if postgres:
        moment: sa.ColumnElement[Any] = sa.func.now()
        if seconds:
            moment = moment + sa.literal(timedelta(seconds=seconds), sa.Interval())
    else:
        moment = sa.func.strftime(
            "%Y-%m-%d %H:%M:%f", "now", f"{seconds:+.6f} seconds", type_=sa.String
        ).concat("000")
    return sa.type_coerce(moment, UTCDateTime)


class SQLTables:
    """What the parts of :class:`~conventions.store.sql.SQLStore` share: the engine, the
    tables (set by its ``__init__``), an upsert and a read connection."""

    engine: sa.Engine
    metadata: sa.MetaData
    dedup: sa.Table
    ledger: sa.Table
    deliveries: sa.Table
    dead_letters: sa.Table
    audit: sa.Table
    leases: sa.Table
    states: sa.Table
    counts: sa.Table
    buckets: sa.Table
    #: the dialect is PostgreSQL (else SQLite)
    _postgres: bool

    def _upsert(
        self,
        table: sa.Table,
        values: Mapping[str, Any],
        where: sa.ColumnElement[bool] | None,
        overrides: Mapping[str, Any] | None = None,
    ) -> sa.Insert:
        """``INSERT values ON CONFLICT (pk) DO UPDATE SET <the same values> WHERE where``."""
        (key,) = table.primary_key.columns
        insert = (postgresql.insert if self._postgres else sqlite.insert)(table).values(values)
        update = {name: insert.excluded[name] for name in values if name != key.name}
        return insert.on_conflict_do_update(
            index_elements=[key], set_={**update, **(overrides or {})}, where=where
        )

    def _now(self) -> sa.ColumnElement[datetime]:
        """The database's clock, in the form the time columns keep: every expiry is
        written and judged by it, so writers need no synchronised clocks."""
        return self._later(0.0)

    def _later(self, seconds: float) -> sa.ColumnElement[datetime]:
        """The database's clock plus ``seconds`` (:func:`later`)."""
        return later(self._postgres, seconds)

    def _epoch(self) -> sa.ColumnElement[float]:
        """The database's clock in POSIX seconds (the token buckets' unit); on PostgreSQL
        the time of the statement, after any wait for the bucket's lock."""
        if self._postgres:
            return sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Float(precision=53))
        return (sa.func.julianday("now", type_=sa.Float(precision=53)) - 2440587.5) * 86400.0

    def purge_expired(self) -> dict[str, int]:
        """Delete the rows past their own expiry, judged by the database's clock, in
        batches of :data:`EXPIRED_BATCH` (one short transaction each); return how many per
        table: ``ledger`` (ended leases, done keys past ``keep``), ``deliveries``,
        ``dedup`` (reservations with a ttl), ``leases`` and ``states``.

        The same rows the Redis store lets expire by TTL, and with the same lifetimes, so
        deleting them changes no answer: every statement already reads them as absent.
        """
        now = self._now()
        expired = {
            "ledger": (self.ledger, self.ledger.c.lease_until < now),
            "deliveries": (self.deliveries, self.deliveries.c.expires_at < now),
            "dedup": (self.dedup, self.dedup.c.expires_at <= now),
            "leases": (self.leases, self.leases.c.expires_at <= now),
            "states": (self.states, self.states.c.expires_at <= now),
        }
        return {name: self._delete_batches(*where) for name, where in expired.items()}

    def _delete_batches(self, table: sa.Table, expired: sa.ColumnElement[bool]) -> int:
        """``DELETE ... WHERE key IN (SELECT key ... LIMIT batch)`` until a batch is short;
        PostgreSQL skips the rows a writer has locked (a claim taking one over)."""
        (key,) = table.primary_key.columns
        removed = 0
        while True:
            batch = sa.select(key).where(expired).limit(EXPIRED_BATCH)
            if self._postgres:
                batch = batch.with_for_update(skip_locked=True)
            with self.engine.begin() as conn:
                count = conn.execute(sa.delete(table).where(key.in_(batch))).rowcount
            removed += count
            if count < EXPIRED_BATCH:
                return removed

    def _read(self) -> sa.Connection:
        """A connection for reads (a plain ``BEGIN`` on SQLite: readers do not queue)."""
        return self.engine.connect().execution_options(cc_read_only=True)


#: columns added after a table's first release: (table suffix, column), added to an
#: existing table by :func:`add_missing_columns` (nullable, so old rows stay valid)
ADDED_COLUMNS = (("dedup", "fingerprint"), ("ledger", "fingerprint"))


def add_missing_columns(engine: sa.Engine, metadata: sa.MetaData, p: str) -> None:
    """``ALTER TABLE ... ADD COLUMN`` for each of :data:`ADDED_COLUMNS` a table made by
    an earlier release lacks (``create_all`` creates missing tables, never columns)."""
    inspector = sa.inspect(engine)
    for suffix, name in ADDED_COLUMNS:
        table = metadata.tables[f"{p}{suffix}"]
        if name in {column["name"] for column in inspector.get_columns(table.name)}:
            continue
        column = table.c[name]
        kind = column.type.compile(dialect=engine.dialect)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{name}" {kind}')
        except sa.exc.DBAPIError:  # another process added it first
            columns = sa.inspect(engine).get_columns(table.name)
            if name not in {column["name"] for column in columns}:
                raise


def _tables(metadata: sa.MetaData, p: str) -> tuple[sa.Table, ...]:
    """The five tables, named ``{p}<name>`` (index names carry the prefix too: PostgreSQL
    index names share the schema's namespace)."""
    dedup = sa.Table(
        f"{p}dedup",
        metadata,
        sa.Column("key", sa.String, primary_key=True),
        sa.Column("job_id", sa.String, nullable=False),
        #: null: kept until released
        sa.Column("expires_at", UTCDateTime, nullable=True),
        #: the payload fingerprint of the reserving job (null: reserved without one)
        sa.Column("fingerprint", sa.String, nullable=True),
    )
    ledger = sa.Table(
        f"{p}ledger",
        metadata,
        sa.Column("key", sa.String, primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),  # running | done
        sa.Column("owner", sa.String, nullable=False),
        # running: end of the lease; done: end of the keep period
        sa.Column("lease_until", UTCDateTime, nullable=False),
        sa.Column("outcome", sa.Text, nullable=True),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        #: done: the payload fingerprint of the run that recorded it
        sa.Column("fingerprint", sa.String, nullable=True),
    )
    deliveries = sa.Table(
        f"{p}deliveries",
        metadata,
        sa.Column("delivery_id", sa.String, primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
    )
    dead_letters = sa.Table(
        f"{p}dead_letters",
        metadata,
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("task", sa.String, nullable=False),
        sa.Column("task_id", sa.String, nullable=False),
        sa.Column("category", sa.String(16), nullable=False),
        sa.Column("last_failed_at", UTCDateTime, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Index(f"ix_{p}dead_letters_time", "last_failed_at"),
        sa.Index(f"ix_{p}dead_letters_task_time", "task", "last_failed_at"),
        sa.Index(f"ix_{p}dead_letters_category_time", "category", "last_failed_at"),
    )
    audit = sa.Table(
        f"{p}audit",
        metadata,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("correlation_id", sa.String, nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Index(f"ix_{p}audit_correlation", "correlation_id"),
        sa.Index(f"ix_{p}audit_at", "at"),
    )
    return dedup, ledger, deliveries, dead_letters, audit


def _lease_tables(metadata: sa.MetaData, p: str) -> tuple[sa.Table, sa.Table]:
    """Named leases and small state documents."""
    leases = sa.Table(
        f"{p}leases",
        metadata,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("owner", sa.String, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
    )
    states = sa.Table(
        f"{p}states",
        metadata,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("data", sa.Text, nullable=False),
        #: null: kept until deleted
        sa.Column("expires_at", UTCDateTime, nullable=True),
    )
    return leases, states


def _counts_table(metadata: sa.MetaData, p: str) -> sa.Table:
    """``{p}counts``: the counters the audit events move (:mod:`conventions.store.counts`)."""
    return sa.Table(
        f"{p}counts",
        metadata,
        sa.Column("name", sa.String, primary_key=True),  # <name>|<task>
        sa.Column("value", sa.BigInteger, nullable=False),
    )


def _bucket_table(metadata: sa.MetaData, p: str) -> sa.Table:
    """Token buckets of dependency rate limits: POSIX seconds, see ``tokens.Bucket``."""
    return sa.Table(
        f"{p}buckets",
        metadata,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("tat", sa.Float(precision=53), nullable=False),
        sa.Column("use", sa.Float(precision=53), nullable=False),
        sa.Column("paused", sa.Float(precision=53), nullable=False),
    )
