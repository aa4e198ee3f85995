"""The SQL store: the same contract on PostgreSQL (psycopg 3) or SQLite, with Core only.

Uniqueness is the primary key's job, never a read-then-write: a claim or a reservation is
one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE <expired> RETURNING key``, and a returned
row says it took the key. PostgreSQL locks the conflicting row, so of fifty concurrent claims one
inserts and the others see its live lease; SQLite runs every write transaction as
``BEGIN IMMEDIATE`` (plus a busy timeout), so writers queue instead of failing.

Times are timezone-aware UTC in Python; PostgreSQL keeps ``timestamptz`` and SQLite keeps
naive UTC text (fixed width, so text order is time order). Every expiry (leases, the ledger,
reservations, delivery counters, state records) is written and compared with the
database's clock (``now()``; SQLite's ``'now'``), so a worker whose clock is off cannot
take a live lease or keep a dead one. Expired rows never answer as live; the next writer of
the same key replaces them, and retention deletes the rest in bounded batches
(:meth:`~conventions.store.sql_tables.SQLTables.purge_expired`), as Redis would expire
them by TTL.

The store is one class in parts: this module holds the dedup and ledger statements,
:mod:`conventions.store.sql_records` the dead letters and the audit trail,
:mod:`conventions.store.sql_coordination` the leases, token buckets and state records, and
:mod:`conventions.store.sql_tables` the tables and the helpers every part uses.
"""

from __future__ import annotations

import threading
from typing import Any

from conventions.config import extras, formats
from conventions.config.settings import RUNS_MAX_LOGS

try:
    import sqlalchemy as sa
    from sqlalchemy import event
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the SQL store") from exc

from conventions.store.base import KeyState
from conventions.store.batches import BatchMove
from conventions.store.records import (
    AuditEvent,
    Claim,
    ClaimStatus,
    Holder,
)
from conventions.store.sql_batches import batch_tables
from conventions.store.sql_records import SQLRecords
from conventions.store.sql_runs import runs_table
from conventions.store.sql_stamps import SQLStamp, schema_table
from conventions.store.sql_tables import (
    UTCDateTime,
    _bucket_table,
    _counts_table,
    _lease_tables,
    _tables,
    add_missing_columns,
)

__all__ = ["SQLITE_BUSY_TIMEOUT", "SQLStore", "UTCDateTime", "make_engine"]

#: the schema version of a database made before the stamp existed (today's tables)
RECOGNIZED_SQL = 1

#: seconds a SQLite writer waits for the write lock before giving up
SQLITE_BUSY_TIMEOUT = 30.0


def make_engine(url: str) -> sa.Engine:
    """An engine configured for the store: on SQLite, a busy timeout and write
    transactions that take the write lock up front (``BEGIN IMMEDIATE``).

    Use it too when passing an engine of your own to :class:`SQLStore` for SQLite.
    """
    parsed = sa.make_url(url)
    if parsed.get_driver_name() == "psycopg":  # SQLAlchemy imports it in create_engine
        extras.require("psycopg", "sql", "the SQL store on PostgreSQL")
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True)
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # sqlite3 would otherwise BEGIN (deferred) on its own, only before writes
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        read_only = connection.get_execution_options().get("cc_read_only", False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


class SQLStore(SQLRecords):
    """The :class:`~conventions.store.base.Store` contract on PostgreSQL or SQLite.

    Thread-safe (the engine's pool gives each call its own connection). The tables are
    ``{table_prefix}dedup``, ``ledger``, ``deliveries``, ``dead_letters`` and ``audit``,
    created when missing. An engine passed in is left open by :meth:`close`.
    """

    def __init__(
        self,
        url_or_engine: str | sa.Engine,
        table_prefix: str = "cc_",
        delivery_ttl: float = 7 * 86400,
        *,
        runs_enabled: bool = True,
        runs_max: int = 0,
        runs_max_logs: int = RUNS_MAX_LOGS,
    ) -> None:
        """``runs_max`` is the Redis store's cap: a database is bounded by retention."""
        self._owns_engine = isinstance(url_or_engine, str)
        self._engine = (
            make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
        )
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        dialect = self._engine.dialect.name
        if dialect not in ("postgresql", "sqlite"):
            self.close()
            raise ValueError(f"SQLStore supports postgresql and sqlite, not {dialect!r}")
        self._postgres = dialect == "postgresql"
        self.delivery_ttl = delivery_ttl
        self.metadata = sa.MetaData()
        self.dedup, self.ledger, self.deliveries, self.dead_letters, self.audit = _tables(
            self.metadata, table_prefix
        )
        self.leases, self.states = _lease_tables(self.metadata, table_prefix)
        self.counts = _counts_table(self.metadata, table_prefix)
        self.buckets = _bucket_table(self.metadata, table_prefix)
        self.runs = runs_table(self.metadata, table_prefix)
        self.schema = schema_table(self.metadata, table_prefix)
        self.table_prefix = table_prefix
        self.batches, self.batch_members = batch_tables(self.metadata, table_prefix)
        self.runs_enabled, self.runs_max_logs = runs_enabled, runs_max_logs
        del runs_max

    @property
    def engine(self) -> sa.Engine:
        """The engine, once the tables exist. Making the store connects to nothing: the
        tables are created at its first use, so that a server that does not answer
        then fails that call (the run path keeps the job: deferred) rather than the
        opening of the store (a pool child's first job, outside the run path)."""
        if not self._schema_ready:
            self._create_schema()
        return self._engine

    @engine.setter
    def engine(self, value: sa.Engine) -> None:
        self._engine = value

    def _create_schema(self) -> None:
        """Create the missing tables and stamp them (:mod:`conventions.store.sql_stamps`),
        once per store; a failure is tried again at the next use."""
        with self._schema_lock:
            if self._schema_ready:
                return
            # a database with the ledger already (an earlier release's) is stamped at
            # the version it is recognized at, a new one at this release's
            fresh = not sa.inspect(self._engine).has_table(self.ledger.name)
            try:
                self.metadata.create_all(self._engine, checkfirst=True)
            except sa.exc.DBAPIError:
                # another process created the same tables between our check and our
                # CREATE (or the server does not answer: this raises again)
                self.metadata.create_all(self._engine, checkfirst=True)
            add_missing_columns(self._engine, self.metadata, self.table_prefix)
            version = formats.STORE_SQL if fresh else RECOGNIZED_SQL
            SQLStamp(self._engine, self.table_prefix).stamp_missing("store_sql", version)
            self._schema_ready = True

    # -- enqueue dedup -------------------------------------------------------------------
    def reserve(
        self,
        key: str,
        job_id: str,
        ttl: float | None,
        *,
        audit: AuditEvent | None = None,
        fingerprint: str | None = None,
    ) -> Holder | None:
        """Insert the reservation, or take over an expired one (recording ``audit`` in the
        same transaction); else answer the holder, with its fingerprint."""
        now = self._now()
        t = self.dedup
        expires = None if ttl is None else self._later(ttl)
        taken = self._upsert(
            t,
            {"key": key, "job_id": job_id, "expires_at": expires, "fingerprint": fingerprint},
            where=sa.and_(t.c.expires_at.is_not(None), t.c.expires_at <= now),
        ).returning(t.c.key)
        with self.engine.begin() as conn:
            if conn.execute(taken).first() is not None:
                self._record(conn, audit)
                return None
            holder, printed = conn.execute(
                sa.select(t.c.job_id, t.c.fingerprint).where(t.c.key == key)
            ).one()
        return None if holder == job_id else Holder(str(holder), printed)

    def unreserve(self, key: str, job_id: str) -> None:
        t = self.dedup
        with self.engine.begin() as conn:
            conn.execute(sa.delete(t).where(t.c.key == key, t.c.job_id == job_id))

    def key_state(self, key: str) -> KeyState:
        with self.engine.begin() as conn:
            return self._key_state(conn, key)

    def clear_key(self, key: str, *, audit: AuditEvent | None = None) -> KeyState:
        """Read, delete both rows and record ``audit`` in one transaction."""
        with self.engine.begin() as conn:
            found = self._key_state(conn, key)
            conn.execute(sa.delete(self.dedup).where(self.dedup.c.key == key))
            conn.execute(sa.delete(self.ledger).where(self.ledger.c.key == key))
            self._record(conn, audit)
        return found

    def _key_state(self, conn: sa.Connection, key: str) -> KeyState:
        """The live rows of ``key`` (an expired row is as good as gone: the next
        reserve or claim takes it over)."""
        now, d, t = self._now(), self.dedup, self.ledger
        live = sa.or_(d.c.expires_at.is_(None), d.c.expires_at > now)
        reserved = conn.execute(
            sa.select(d.c.job_id, d.c.expires_at).where(d.c.key == key, live)
        ).first()
        entry = conn.execute(
            sa.select(t.c.state, t.c.owner, t.c.outcome, t.c.lease_until).where(
                t.c.key == key, t.c.lease_until >= now
            )
        ).first()
        return KeyState(
            key=key,
            reserved_by=None if reserved is None else str(reserved.job_id),
            reserved_until=None if reserved is None else reserved.expires_at,
            ledger_state=None if entry is None else str(entry.state),
            ledger_owner=None if entry is None else str(entry.owner),
            ledger_outcome=None if entry is None else entry.outcome,
            ledger_until=None if entry is None else entry.lease_until,
        )

    # -- execution ledger ----------------------------------------------------------------
    def claim(
        self,
        key: str,
        owner: str,
        lease: float,
        delivery_id: str,
        *,
        audit: AuditEvent | None = None,
    ) -> Claim:
        """Take the row if free or expired (one upsert); then count the delivery and
        record ``audit``, in the same transaction."""
        now = self._now()
        t, d = self.ledger, self.deliveries
        taken = self._upsert(
            t,
            {
                "key": key,
                "state": "running",
                "owner": owner,
                "lease_until": self._later(lease),
                "outcome": None,
                "fingerprint": None,
                "updated_at": now,
            },
            where=t.c.lease_until < now,
        ).returning(t.c.key)
        counted = self._upsert(
            d,
            {
                "delivery_id": delivery_id,
                "count": 1,
                "expires_at": self._later(self.delivery_ttl),
            },
            where=None,
            overrides={"count": sa.case((d.c.expires_at < now, 1), else_=d.c.count + 1)},
        ).returning(d.c.count)
        with self.engine.begin() as conn:
            if conn.execute(taken).first() is not None:
                count = conn.execute(counted).scalar_one()
                self._record(conn, audit)
                return Claim(ClaimStatus.CLAIMED, holder=owner, deliveries=int(count))
            # the upsert locked the live row (PostgreSQL) or we hold the write lock (SQLite)
            state, holder, outcome, printed = conn.execute(
                sa.select(t.c.state, t.c.owner, t.c.outcome, t.c.fingerprint).where(t.c.key == key)
            ).one()
        if state == "done":
            return Claim(ClaimStatus.DONE, holder=holder, outcome=outcome, fingerprint=printed)
        return Claim(ClaimStatus.HELD, holder=holder)

    def renew(self, key: str, owner: str, lease: float) -> bool:
        now = self._now()
        t = self.ledger
        renewed = (
            sa.update(t)
            .where(
                t.c.key == key, t.c.state == "running", t.c.owner == owner, t.c.lease_until > now
            )
            .values(lease_until=self._later(lease), updated_at=now)
        )
        with self.engine.begin() as conn:
            return conn.execute(renewed).rowcount == 1

    def complete(
        self,
        key: str,
        owner: str,
        outcome: str,
        keep: float,
        reserved_by: str | None,
        *,
        audit: AuditEvent | None = None,
        fingerprint: str | None = None,
        delivery_id: str | None = None,
        batch: BatchMove | None = None,
    ) -> list[str]:
        """Done if the lease is still ours or has expired (the result stands); ``audit``
        is recorded either way, except on a replay (done already, by ``owner``: a retried
        write whose first reply was lost), which changes nothing, as on Redis. The
        delivery counter's row (``delivery_id``) is left to the retention purge.
        ``batch``: the member's end, moved in the same transaction; answers the batch
        callbacks it made due."""
        now = self._now()
        t = self.ledger
        done = self._upsert(
            t,
            {
                "key": key,
                "state": "done",
                "owner": owner,
                "lease_until": self._later(keep),
                "outcome": outcome,
                "updated_at": now,
                "fingerprint": fingerprint,
            },
            where=sa.or_(
                sa.and_(t.c.state == "running", t.c.owner == owner), t.c.lease_until < now
            ),
        ).returning(t.c.key)
        with self.engine.begin() as conn:
            if conn.execute(done).first() is None:
                # left as it was: the row is locked (PostgreSQL) or we hold the write lock
                entry = conn.execute(
                    sa.select(t.c.state, t.c.owner).where(t.c.key == key)
                ).one_or_none()
                if entry is not None and tuple(entry) == ("done", owner):
                    return [] if batch is None else self._end_member(conn, batch)
            self._drop_reservation(conn, key, reserved_by)
            self._record(conn, audit)
            return [] if batch is None else self._end_member(conn, batch)

    def release(self, key: str, owner: str, reserved_by: str | None) -> None:
        t = self.ledger
        with self.engine.begin() as conn:
            conn.execute(
                sa.delete(t).where(t.c.key == key, t.c.state == "running", t.c.owner == owner)
            )
            self._drop_reservation(conn, key, reserved_by)

    def _drop_reservation(self, conn: sa.Connection, key: str, reserved_by: str | None) -> None:
        if reserved_by is not None:
            t = self.dedup
            conn.execute(sa.delete(t).where(t.c.key == key, t.c.job_id == reserved_by))

    def close(self) -> None:
        if self._owns_engine:
            self._engine.dispose()
