"""The SQL store's records: dead letters and the audit trail, with its counters.

One part of :class:`~conventions.store.sql.SQLStore` (see that module for the whole):
each method is one short transaction; purges go in bounded batches.
"""

from __future__ import annotations

import json
from datetime import datetime

from conventions.config import extras

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the SQL store") from exc

from conventions.store import counts
from conventions.store.batches import BatchMove
from conventions.store.records import SWAP_TRIES, AuditEvent, Category, DeadLetter, replayed_copy
from conventions.store.sql_batches import SQLBatches
from conventions.store.sql_runs import SQLRuns


class SQLRecords(SQLRuns, SQLBatches):
    """Dead letters and audit events, on the tables of :class:`SQLTables`."""

    # -- dead letters --------------------------------------------------------------------
    def put_dead_letter(self, record: DeadLetter, *, batch: BatchMove | None = None) -> list[str]:
        """``batch``: the member's end (failed), moved in the same transaction; answers
        the batch callbacks it made due."""
        stored = self._upsert(
            self.dead_letters,
            {
                "id": record.id,
                "task": record.task,
                "task_id": record.task_id,
                "category": str(record.category),
                "last_failed_at": record.last_failed_at,
                "data": json.dumps(record.to_dict()),
            },
            where=None,
        )
        with self.engine.begin() as conn:
            conn.execute(stored)
            return [] if batch is None else self._end_member(conn, batch)

    def get_dead_letter(self, record_id: str) -> DeadLetter | None:
        t = self.dead_letters
        with self._read() as conn:
            data = conn.execute(sa.select(t.c.data).where(t.c.id == record_id)).scalar()
        return None if data is None else DeadLetter.from_dict(json.loads(data))

    def swap_replayed_at(self, record_id: str, seen: datetime | None, at: datetime | None) -> bool:
        """A compare-and-set of the record's whole JSON text (``UPDATE ... WHERE data =
        <as read>``): no JSON function of either database, no lock held between reads."""
        t = self.dead_letters
        for _ in range(SWAP_TRIES):  # the record may change meanwhile (a new failure)
            with self._read() as conn:
                raw = conn.execute(sa.select(t.c.data).where(t.c.id == record_id)).scalar()
            data = None if raw is None else replayed_copy(raw, seen, at)
            if data is None:
                return False
            with self.engine.begin() as conn:
                swapped = conn.execute(
                    sa.update(t).where(t.c.id == record_id, t.c.data == raw).values(data=data)
                )
            if swapped.rowcount == 1:
                return True
        return False

    def list_dead_letters(
        self,
        task: str | None = None,
        category: Category | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[DeadLetter]:
        """Newest first (ties by id, descending), served by the time indexes."""
        if limit <= 0:
            return []
        t = self.dead_letters
        query = sa.select(t.c.data).order_by(t.c.last_failed_at.desc(), t.c.id.desc())
        if task is not None:
            query = query.where(t.c.task == task)
        if category is not None:
            query = query.where(t.c.category == str(category))
        if since is not None:
            query = query.where(t.c.last_failed_at >= since)
        with self._read() as conn:
            rows = conn.execute(query.limit(limit)).scalars().all()
        return [DeadLetter.from_dict(json.loads(data)) for data in rows]

    def count_dead_letters(self) -> int:
        with self._read() as conn:
            return int(
                conn.execute(sa.select(sa.func.count()).select_from(self.dead_letters)).scalar_one()
            )

    def delete_dead_letter(self, record_id: str) -> bool:
        t = self.dead_letters
        with self.engine.begin() as conn:
            return conn.execute(sa.delete(t).where(t.c.id == record_id)).rowcount == 1

    def purge_dead_letters(self, older_than: datetime) -> int:
        """In bounded batches, like every purge of this store."""
        t = self.dead_letters
        return self._delete_batches(t, t.c.last_failed_at < older_than)

    # -- audit trail ---------------------------------------------------------------------
    def add_audit(self, event: AuditEvent) -> None:
        with self.engine.begin() as conn:
            self._record(conn, event)

    def _record(self, conn: sa.Connection, event: AuditEvent | None) -> None:
        if event is not None:
            row = {
                "correlation_id": event.correlation_id,
                "at": event.at,
                "data": json.dumps(event.to_dict()),
            }
            conn.execute(sa.insert(self.audit).values(row))
            self._count(conn, event)
            self._record_run(conn, event)

    def _count(self, conn: sa.Connection, event: AuditEvent) -> None:
        """Move the event's counters in the caller's transaction: one multi-row upsert, rows
        in a fixed order (two transactions lock shared counter rows in the same order)."""
        t = self.counts
        rows = [{"name": n, "value": v} for n, v in sorted(counts.fields(event).items())]
        insert = (postgresql.insert if self._postgres else sqlite.insert)(t).values(rows)
        conn.execute(
            insert.on_conflict_do_update(
                index_elements=[t.c.name], set_={"value": t.c.value + insert.excluded.value}
            )
        )

    def counters(self) -> dict[tuple[str, str], int]:
        """Every counter the audit events moved."""
        t = self.counts
        with self._read() as conn:
            rows = conn.execute(sa.select(t.c.name, t.c.value)).all()
        return {counts.split(name): int(value) for name, value in rows}

    def audit_for(self, correlation_id: str) -> list[AuditEvent]:
        """In event time order (insertion order among equal times)."""
        t = self.audit
        query = (
            sa.select(t.c.data).where(t.c.correlation_id == correlation_id).order_by(t.c.at, t.c.id)
        )
        with self._read() as conn:
            rows = conn.execute(query).scalars().all()
        return [AuditEvent.from_dict(json.loads(data)) for data in rows]

    def purge_audit(self, older_than: datetime) -> int:
        """Drops whole trails whose last event is before ``older_than``; counts events.

        Same rule as the Redis store: a trail with one recent event is kept whole.
        """
        t = self.audit
        recent = sa.select(t.c.correlation_id).where(t.c.at >= older_than)
        return self._delete_batches(
            t, sa.and_(t.c.at < older_than, t.c.correlation_id.not_in(recent))
        )
