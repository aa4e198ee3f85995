"""The run history part of the SQL store (:mod:`conventions.store.runs`).

One row per run in ``{p}runs``: the fields it is found by as columns (indexed), the
whole record as JSON. A row changes in the transaction of the audit event that carries
the change (:meth:`SQLRuns._record_run`): the row is locked (``SELECT ... FOR UPDATE``
on PostgreSQL; SQLite writes one at a time), merged (:func:`runs.merge`) and written; a
run's first event inserts with ``ON CONFLICT DO NOTHING`` and, when another first event
won the insert, merges into that row, so two first events at once both land.
Retention purges by creation time, in batches.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from conventions.config import extras
from conventions.config.settings import RUNS_MAX_LOGS

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the SQL store") from exc

from conventions.store import runs
from conventions.store.records import AuditEvent
from conventions.store.runs import Run
from conventions.store.sql_coordination import SQLCoordination
from conventions.store.sql_tables import UTCDateTime


def runs_table(metadata: sa.MetaData, p: str) -> sa.Table:
    """``{p}runs``: one row per run."""
    return sa.Table(
        f"{p}runs",
        metadata,
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("task", sa.String(255), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("queue", sa.String(255)),
        sa.Column("key", sa.String(1024)),
        sa.Column("correlation_id", sa.String(255)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Index(f"ix_{p}runs_created", "created_at"),
        sa.Index(f"ix_{p}runs_task", "task", "created_at"),
        sa.Index(f"ix_{p}runs_state", "state", "created_at"),
        sa.Index(f"ix_{p}runs_correlation", "correlation_id"),
        sa.Index(f"ix_{p}runs_key", "key"),
    )


class SQLRuns(SQLCoordination):
    """Run records on ``self.runs``."""

    runs: sa.Table
    runs_enabled: bool = True
    runs_max_logs: int = RUNS_MAX_LOGS

    def _record_run(self, conn: sa.Connection, event: AuditEvent) -> None:
        """Apply ``event``'s run change in the caller's transaction.

        The row is read locked (``FOR UPDATE`` on PostgreSQL; SQLite's writes take the
        database lock at ``BEGIN IMMEDIATE``) and merged. A run's first event has no row
        to lock: it inserts with ``ON CONFLICT DO NOTHING``, and when another
        transaction's first event won that insert (PostgreSQL waits for it to commit),
        reads the row it wrote, locked, and merges into it: no event is lost.
        """
        change = event.run
        if change is None or not self.runs_enabled:
            return
        found = self._locked_run(conn, change["id"])
        if found is None:
            doc = runs.merge(None, change, max_logs=self.runs_max_logs)
            insert = (postgresql.insert if self._postgres else sqlite.insert)(self.runs)
            row = {"id": change["id"], **self._run_row(doc)}
            if conn.execute(insert.values(row).on_conflict_do_nothing()).rowcount == 1:
                return
            found = self._locked_run(conn, change["id"])  # another first event's row
        if found is None:  # the winner's row went before we read it (a purge): not a race
            raise RuntimeError(f"run {change['id']}: its row vanished between two statements")
        doc = runs.merge(json.loads(found), change, max_logs=self.runs_max_logs)
        t = self.runs
        conn.execute(sa.update(t).where(t.c.id == change["id"]).values(self._run_row(doc)))

    def _locked_run(self, conn: sa.Connection, run_id: str) -> str | None:
        t = self.runs
        query = sa.select(t.c.data).where(t.c.id == run_id)
        if self._postgres:
            query = query.with_for_update()
        found = conn.execute(query).scalar()
        return None if found is None else str(found)

    @staticmethod
    def _run_row(doc: dict[str, Any]) -> dict[str, Any]:
        """A record's columns: the fields it is found by, and the whole as JSON."""
        run = Run.from_doc(doc)
        return {
            "task": run.task, "state": run.state, "queue": run.queue, "key": run.key,
            "correlation_id": run.correlation_id, "created_at": run.created_at,
            "updated_at": run.updated_at, "data": json.dumps(doc),
        }  # fmt: skip

    def get_run(self, task_id: str) -> Run | None:
        t = self.runs
        with self._read() as conn:
            data = conn.execute(sa.select(t.c.data).where(t.c.id == task_id)).scalar()
        return None if data is None else Run.from_doc(json.loads(data))

    def list_runs(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        **filters: str | None,
    ) -> list[Run]:
        """Newest first (by creation, ties by id descending)."""
        unknown = set(filters) - set(runs.FILTERS)
        if unknown:
            raise TypeError(f"list_runs: unknown filters {sorted(unknown)}")
        if limit <= 0:
            return []
        t = self.runs
        query = sa.select(t.c.data).order_by(t.c.created_at.desc(), t.c.id.desc())
        for name, value in filters.items():
            if value is not None:
                query = query.where(t.c[name] == value)
        if since is not None:
            query = query.where(t.c.created_at >= since)
        if until is not None:
            query = query.where(t.c.created_at <= until)
        with self._read() as conn:
            rows = conn.execute(query.limit(limit)).scalars().all()
        return [Run.from_doc(json.loads(data)) for data in rows]

    def count_runs(self) -> int:
        with self._read() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(self.runs)).scalar_one())

    def purge_runs(self, older_than: datetime) -> int:
        t = self.runs
        return self._delete_batches(t, t.c.created_at < older_than)
