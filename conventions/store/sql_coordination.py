"""The coordination part of the SQL store: named leases, token buckets, state records.

A lease is a row with its owner and expiry, taken by one upsert; a token bucket is a row
locked while :func:`conventions.store.tokens.step` runs. Both use the database's clock
(read in the same statement), never the writer's.
:class:`SQLCoordination` is a part of :class:`~conventions.store.sql.SQLStore`, not a
store on its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from conventions.config import extras

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the SQL store") from exc

from conventions.store import tokens
from conventions.store.sql_tables import SQLTables


class SQLCoordination(SQLTables):
    """Leases, token buckets and small state records: the methods of
    :class:`~conventions.store.sql.SQLStore` that coordinate workers."""

    # -- leases ---------------------------------------------------------------------------
    def acquire(self, name: str, owner: str, ttl: float) -> str | None:
        """One upsert takes a free or expired lease or extends our own; else the holder."""
        now = self._now()
        t = self.leases
        taken = self._upsert(
            t,
            {"name": name, "owner": owner, "expires_at": self._later(ttl)},
            where=sa.or_(t.c.expires_at <= now, t.c.owner == owner),
        ).returning(t.c.name)
        with self.engine.begin() as conn:
            if conn.execute(taken).first() is not None:
                return None
            holder = conn.execute(sa.select(t.c.owner).where(t.c.name == name)).scalar_one()
        return str(holder)

    def renew_lease(self, name: str, owner: str, ttl: float) -> bool:
        t = self.leases
        renewed = (
            sa.update(t)
            .where(t.c.name == name, t.c.owner == owner, t.c.expires_at > self._now())
            .values(expires_at=self._later(ttl))
        )
        with self.engine.begin() as conn:
            return conn.execute(renewed).rowcount == 1

    def release_lease(self, name: str, owner: str) -> bool:
        t = self.leases
        dropped = sa.delete(t).where(
            t.c.name == name, t.c.owner == owner, t.c.expires_at > self._now()
        )
        with self.engine.begin() as conn:
            return conn.execute(dropped).rowcount == 1

    def lease_holder(self, name: str) -> str | None:
        t = self.leases
        with self._read() as conn:
            holder = conn.execute(
                sa.select(t.c.owner).where(t.c.name == name, t.c.expires_at > self._now())
            ).scalar()
        return None if holder is None else str(holder)

    def acquire_any(self, names: Sequence[str], owner: str, ttl: float) -> str | None:
        """One :meth:`acquire` per name until one is ours: caps are meant to be small."""
        for name in names:
            if self.acquire(name, owner, ttl) is None:
                return name
        return None

    # -- token buckets ----------------------------------------------------------------------
    def take_token(
        self, name: str, interval: float, burst: int, max_wait: float, booked: bool
    ) -> float:
        """The bucket row is locked (``FOR UPDATE``; SQLite's writers queue anyway) while
        :func:`tokens.step` runs on the database's clock, read with the row."""
        with self.engine.begin() as conn:
            bucket, now = self._lock_bucket(conn, name)
            after, wait = tokens.step(
                bucket, now, interval, burst, max_wait=max_wait, booked=booked
            )
            if after != bucket:
                self._save_bucket(conn, name, after)
        return wait

    def pause_tokens(self, name: str, seconds: float) -> None:
        with self.engine.begin() as conn:
            bucket, now = self._lock_bucket(conn, name)
            until = now + seconds
            self._save_bucket(conn, name, tokens.pause(bucket, until))

    def _lock_bucket(self, conn: sa.Connection, name: str) -> tuple[tokens.Bucket, float]:
        """The bucket, locked, and the database's clock (POSIX seconds)."""
        t = self.buckets
        insert = (postgresql.insert if self._postgres else sqlite.insert)(t)
        conn.execute(
            insert.values(name=name, tat=0.0, use=0.0, paused=0.0).on_conflict_do_nothing()
        )
        row = conn.execute(
            sa.select(t.c.tat, t.c.use, t.c.paused, self._epoch().label("now"))
            .where(t.c.name == name)
            .with_for_update()
        ).one()
        return tokens.Bucket(float(row.tat), float(row.use), float(row.paused)), float(row.now)

    def _save_bucket(self, conn: sa.Connection, name: str, bucket: tokens.Bucket) -> None:
        t = self.buckets
        conn.execute(
            sa.update(t)
            .where(t.c.name == name)
            .values(tat=bucket.tat, use=bucket.use, paused=bucket.paused)
        )

    # -- small state records ------------------------------------------------------------
    def put_state(self, name: str, value: Mapping[str, Any], ttl: float | None) -> None:
        expires = None if ttl is None else self._later(ttl)
        data = json.dumps(dict(value), separators=(",", ":"), default=str)
        row = {"name": name, "data": data, "expires_at": expires}
        with self.engine.begin() as conn:
            conn.execute(self._upsert(self.states, row, where=None))

    def get_state(self, name: str) -> dict[str, Any] | None:
        t = self.states
        alive = sa.or_(t.c.expires_at.is_(None), t.c.expires_at > self._now())
        with self._read() as conn:
            data = conn.execute(sa.select(t.c.data).where(t.c.name == name, alive)).scalar()
        return None if data is None else cast(dict[str, Any], json.loads(data))

    def delete_state(self, name: str) -> None:
        t = self.states
        with self.engine.begin() as conn:
            conn.execute(sa.delete(t).where(t.c.name == name))
