"""The SQL store's stamp: the table ``{prefix}schema`` (``cc_schema``), the same fields
as the Redis stamp (:mod:`conventions.store.stamps`), one row each.

=================  =======================================================================
``name``           ``store_sql``, ``progress:<format>:<version>`` or ``lock``
``value``          the version, the step's cursor, or the lock's owner
``expires_at``     the lock's expiry (the database's clock); null on the other rows
=================  =======================================================================

A step's end is fenced as on Redis: in one transaction, the lock row is checked to be
ours and alive (``UPDATE ... WHERE`` locks it on PostgreSQL; SQLite's write transactions
are serial), then the version is written and the progress row deleted.
"""

from __future__ import annotations

from typing import Final

from conventions.config import extras

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the SQL store") from exc

from conventions.store.sql_tables import UTCDateTime, later
from conventions.store.stamps import LOCK, LockLost, progress_field, version_of

#: the table's name after the store's prefix
SUFFIX: Final = "schema"


def schema_table(metadata: sa.MetaData, p: str) -> sa.Table:
    """``{p}schema``: the stamp's rows."""
    return sa.Table(
        f"{p}{SUFFIX}",
        metadata,
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        #: the lock row's expiry (null on the others)
        sa.Column("expires_at", UTCDateTime, nullable=True),
    )


class SQLStamp:
    """The stamp of a SQL store in ``{p}schema`` (created at its first write)."""

    def __init__(self, engine: sa.Engine, prefix: str = "cc_") -> None:
        self.engine = engine
        self.postgres = engine.dialect.name == "postgresql"
        self.table = schema_table(sa.MetaData(), prefix)
        self.where = f"sql {self.table.name}"

    def exists(self) -> bool:
        return sa.inspect(self.engine).has_table(self.table.name)

    def ensure(self) -> None:
        """Create the table when missing (another process creating it too is fine)."""
        try:
            self.table.create(self.engine, checkfirst=True)
        except sa.exc.DBAPIError:
            if not self.exists():
                raise

    def read(self) -> dict[str, str]:
        if not self.exists():
            return {}
        t = self.table
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.name, t.c.value)).all()
        return {str(name): str(value) for name, value in rows}

    def stamp_missing(self, format_name: str, version: int) -> int:
        self.ensure()
        t = self.table
        insert = (postgresql.insert if self.postgres else sqlite.insert)(t)
        with self.engine.begin() as conn:
            conn.execute(
                insert.values(name=format_name, value=str(version)).on_conflict_do_nothing()
            )
            found = conn.execute(sa.select(t.c.value).where(t.c.name == format_name))
            return version_of(self.where, format_name, str(found.scalar_one()))

    def acquire(self, owner: str, ttl: float) -> str | None:
        self.ensure()
        t = self.table
        insert = (postgresql.insert if self.postgres else sqlite.insert)(t).values(
            name=LOCK, value=owner, expires_at=later(self.postgres, ttl)
        )
        taken = insert.on_conflict_do_update(
            index_elements=[t.c.name],
            set_={"value": owner, "expires_at": insert.excluded.expires_at},
            where=sa.or_(t.c.value == owner, t.c.expires_at <= later(self.postgres, 0)),
        ).returning(t.c.name)
        with self.engine.begin() as conn:
            if conn.execute(taken).first() is not None:
                return None
            return str(conn.execute(sa.select(t.c.value).where(t.c.name == LOCK)).scalar_one())

    def renew(self, owner: str, ttl: float) -> bool:
        with self.engine.begin() as conn:
            return self._held(conn, owner, ttl)

    def release(self, owner: str) -> None:
        t = self.table
        with self.engine.begin() as conn:
            conn.execute(sa.delete(t).where(t.c.name == LOCK, t.c.value == owner))

    def checkpoint(self, owner: str, format_name: str, version: int, cursor: str) -> None:
        with self.engine.begin() as conn:
            self._fence(conn, owner)
            self._put(conn, progress_field(format_name, version), cursor)

    def advance(self, owner: str, format_name: str, version: int) -> None:
        t = self.table
        with self.engine.begin() as conn:
            self._fence(conn, owner)
            self._put(conn, format_name, str(version))
            conn.execute(sa.delete(t).where(t.c.name == progress_field(format_name, version)))

    def _held(self, conn: sa.Connection, owner: str, ttl: float) -> bool:
        """Push the lock's expiry ``ttl`` seconds on when ``owner`` holds it alive."""
        t = self.table
        renewed = (
            sa.update(t)
            .where(t.c.name == LOCK, t.c.value == owner, t.c.expires_at > later(self.postgres, 0))
            .values(expires_at=later(self.postgres, ttl))
        )
        return bool(conn.execute(renewed).rowcount == 1)

    def _fence(self, conn: sa.Connection, owner: str) -> None:
        """LockLost unless ``owner`` holds the lock (the row stays locked on PostgreSQL
        until the transaction ends)."""
        t = self.table
        held = (
            sa.update(t)
            .where(t.c.name == LOCK, t.c.value == owner, t.c.expires_at > later(self.postgres, 0))
            .values(value=owner)
        )
        if conn.execute(held).rowcount != 1:
            raise LockLost(f"the migrate lock on {self.where} is no longer {owner}'s")

    def _put(self, conn: sa.Connection, name: str, value: str) -> None:
        t = self.table
        insert = (postgresql.insert if self.postgres else sqlite.insert)(t).values(
            name=name, value=value
        )
        conn.execute(insert.on_conflict_do_update(index_elements=[t.c.name], set_={"value": value}))
