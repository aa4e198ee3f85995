"""The SQL store's schema: its column type, its tables, and the two statement helpers
every part of :class:`~conventions.store.sql.SQLStore` uses.

Table and index names carry the store's prefix (``cc_`` by default). The layer's other
tables (the outbox's, the relay's) use :class:`UTCDateTime` too, and import it from
:mod:`conventions.store.sql`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect


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

    def _read(self) -> sa.Connection:
        """A connection for reads (a plain ``BEGIN`` on SQLite: readers do not queue)."""
        return self.engine.connect().execution_options(cc_read_only=True)


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
    """``{p}counts``: the counters the audit events move (:mod:`conventions.counts`)."""
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
