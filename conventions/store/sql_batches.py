"""The batches part of the SQL store (:mod:`conventions.store.batches`).

Two tables: ``{p}batches`` (counters, callbacks' states and when each became due) and
``{p}batch_members`` (one row per member). A member's end is moved inside the
transaction of the member's completion or dead letter (:meth:`SQLBatches._end_member`),
by conditional ``UPDATE``\\ s: the member's row changes only from the state the move
starts from, and the batch's row is updated (and so locked, on PostgreSQL; SQLite holds
the write lock) before its counters are read, so two members that end at once read
each other's move and exactly one of them sees ``pending`` reach 0.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from conventions.errors import ConfigurationError
from conventions.store import batches as b
from conventions.store.sql_tables import SQLTables, UTCDateTime

try:
    import sqlalchemy as sa
except ModuleNotFoundError:  # pragma: no cover  (sql_tables raised MissingExtra first)
    raise

#: the counter a member's state is counted in
_COUNTER = {b.PENDING: "pending", b.SUCCEEDED: "succeeded", b.FAILED: "failed"}


def batch_tables(metadata: sa.MetaData, p: str) -> tuple[sa.Table, sa.Table]:
    """``{p}batches`` and ``{p}batch_members``."""
    batches = sa.Table(
        f"{p}batches",
        metadata,
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("parent", sa.String(255), nullable=True),
        *(sa.Column(name, sa.Integer, nullable=False) for name in ("total", *_COUNTER.values())),
        sa.Column("published", sa.Boolean, nullable=False, default=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("ended_at", UTCDateTime, nullable=True),
        *(sa.Column(which, sa.String(8), nullable=False) for which in b.CALLBACKS),
        *(sa.Column(f"{which}_due_at", UTCDateTime, nullable=True) for which in b.CALLBACKS),
        sa.Index(f"{p}batches_created", "created_at"),
        # the sweep's look-up (every worker, every 15 s): the few callbacks due
        *(sa.Index(f"{p}batches_{which}", which) for which in b.CALLBACKS),
    )
    members = sa.Table(
        f"{p}batch_members",
        metadata,
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("member", sa.String(1100), primary_key=True),
        sa.Column("state", sa.String(1), nullable=False),
        sa.Column("task_id", sa.String(255), nullable=False, default=""),
        sa.Column("dead_letter_id", sa.String(255), nullable=False, default=""),
    )
    return batches, members


class SQLBatches(SQLTables):
    """Batches on ``self.batches`` and ``self.batch_members``."""

    batches: sa.Table
    batch_members: sa.Table

    def create_batch(self, spec: b.BatchSpec) -> bool:
        t, m = self.batches, self.batch_members
        row = {
            "id": spec.id, "spec": spec.document(), "parent": spec.parent,
            "total": len(spec.members), "pending": len(spec.members), "succeeded": 0,
            "failed": 0, "published": False, "created_at": self._now(),
            **{w: b.WAITING if w in spec.callbacks else b.NO_CALLBACK for w in b.CALLBACKS},
        }  # fmt: skip
        with self.engine.begin() as conn:
            if conn.execute(sa.select(t.c.id).where(t.c.id == spec.id)).first() is not None:
                return False
            try:
                with conn.begin_nested():
                    conn.execute(sa.insert(t).values(row))
            except sa.exc.IntegrityError:  # another submitter made it first
                return False
            conn.execute(
                sa.insert(m),
                [{"batch_id": spec.id, "member": name, "state": b.PENDING, "task_id": "",
                  "dead_letter_id": ""} for name in spec.members],
            )  # fmt: skip
        return True

    def mark_batch_published(self, batch_id: str) -> None:
        t = self.batches
        with self.engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.id == batch_id).values(published=True))

    def end_member(self, move: b.BatchMove) -> list[str]:
        with self.engine.begin() as conn:
            return self._end_member(conn, move)

    def _end_member(self, conn: sa.Connection, move: b.BatchMove) -> list[str]:
        """Move ``move``'s member (then, as each batch ends, its entry in the parent) in
        the transaction of ``conn``; the callbacks made due."""
        fired: list[str] = []
        member, outcome = move.member, move.outcome
        task_id, dead = move.task_id, move.dead_letter_id
        for batch_id in move.chain:
            before = self._move_member(conn, batch_id, (member, outcome, task_id, dead))
            if before is None:
                return fired
            t = self.batches
            after = _COUNTER[outcome]
            counted = conn.execute(
                sa.update(t).where(t.c.id == batch_id)
                .values({before: t.c[before] - 1, after: t.c[after] + 1})
                .returning(t.c.pending, t.c.failed, t.c.on_success, t.c.on_complete)
            ).one()  # fmt: skip
            pending, failed, on_success, on_complete = counted
            if pending > 0:
                return fired
            conn.execute(
                sa.update(t).where(t.c.id == batch_id, t.c.ended_at.is_(None))
                .values(ended_at=self._now())
            )  # fmt: skip
            due = [b.ON_COMPLETE] if on_complete == b.WAITING else []
            if failed == 0 and on_success == b.WAITING:
                due.append(b.ON_SUCCESS)
            for which in due:
                conn.execute(
                    sa.update(t).where(t.c.id == batch_id)
                    .values({which: b.DUE, f"{which}_due_at": self._now()})
                )  # fmt: skip
                fired.append(f"{batch_id}|{which}")
            member, task_id, dead = b.nested_member(batch_id), "", ""
            outcome = b.SUCCEEDED if failed == 0 else b.FAILED
        return fired

    def _move_member(
        self, conn: sa.Connection, batch_id: str, change: tuple[str, str, str, str]
    ) -> str | None:
        """The counter the member leaves (its state moved to ``outcome``), or None when
        the move changes nothing (not a member, or ended so already)."""
        member, outcome, task_id, dead = change
        m = self.batch_members
        starts = [b.PENDING, b.FAILED] if outcome == b.SUCCEEDED else [b.PENDING]
        for start in starts:
            moved = conn.execute(
                sa.update(m)
                .where(m.c.batch_id == batch_id, m.c.member == member, m.c.state == start)
                .values(state=outcome, task_id=task_id, dead_letter_id=dead)
            ).rowcount  # fmt: skip
            if moved:
                return _COUNTER[start]
        return None

    def callback_sent(self, batch_id: str, which: str) -> None:
        t = self.batches
        if which not in b.CALLBACKS:
            raise ConfigurationError(f"no batch callback {which!r}")
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(t).where(t.c.id == batch_id, t.c[which] == b.DUE).values({which: b.SENT})
            )

    def due_callbacks(self, grace: float, limit: int = 100) -> list[str]:
        t = self.batches
        found: list[str] = []
        with self._read() as conn:
            for which in b.CALLBACKS:
                rows = conn.execute(
                    sa.select(t.c.id)
                    .where(t.c[which] == b.DUE, t.c[f"{which}_due_at"] < self._later(-grace))
                    .limit(limit)
                )  # fmt: skip
                found += [f"{row.id}|{which}" for row in rows]
        return found[:limit]

    def purge_batches(self, older_than: datetime) -> int:
        t, m = self.batches, self.batch_members
        ended = sa.select(t.c.id).where(
            t.c.ended_at < older_than, t.c.on_success != b.DUE, t.c.on_complete != b.DUE
        )
        with self.engine.begin() as conn:
            conn.execute(sa.delete(m).where(m.c.batch_id.in_(ended)))
            return int(conn.execute(sa.delete(t).where(t.c.id.in_(ended))).rowcount)

    def get_batch(self, batch_id: str, *, members: bool = True) -> b.BatchStatus | None:
        t, m = self.batches, self.batch_members
        with self._read() as conn:
            row = conn.execute(sa.select(t).where(t.c.id == batch_id)).first()
            if row is None:
                return None
            entries = {}
            if members:
                for entry in conn.execute(sa.select(m).where(m.c.batch_id == batch_id)):
                    entries[entry.member] = (entry.state, entry.task_id, entry.dead_letter_id)
        return _status(row._mapping, entries)

    def list_batches(self, limit: int = 100) -> list[b.BatchStatus]:
        t = self.batches
        with self._read() as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.created_at.desc()).limit(limit))
            return [_status(row._mapping, {}) for row in rows]


def _status(row: Any, members: dict[str, tuple[str, str, str]]) -> b.BatchStatus:
    spec = json.loads(row["spec"] or "{}")
    return b.BatchStatus(
        id=row["id"], total=row["total"], pending=row["pending"], succeeded=row["succeeded"],
        failed=row["failed"], published=bool(row["published"]), created_at=row["created_at"],
        ended_at=row["ended_at"], parent=row["parent"], callbacks=spec.get("callbacks") or {},
        callback_states={w: row[w] for w in b.CALLBACKS if row[w] != b.NO_CALLBACK},
        members=members,
    )  # fmt: skip
