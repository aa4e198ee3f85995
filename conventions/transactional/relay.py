"""The outbox relay: publish committed outbox rows, mark them published, never lose one.

One batch: claim up to ``batch`` due rows, publish each through the task's own
``apply_async`` (enqueue dedup, audit, headers: exactly what ``.delay()`` does) with the
row's task id, then mark the published rows.

* PostgreSQL: the rows are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED`` and marked
  in the same transaction, so several relays share the work and no row is published by
  two of them.
* SQLite has no row locks: one relay at a time holds a lease row (``cc_outbox_relay``,
  taken over when its holder stops renewing it); it reads the due rows, publishes, then
  marks them in a short write transaction, so the web app's writers are never blocked
  while the relay talks to the broker.

A relay that dies after publishing and before marking leaves the rows unpublished: the
next batch publishes them again with the same task id. The enqueue reservation is then
this task id's own, and the execution ledger skips a job whose key is already done: the
duplicate is absorbed, never run twice.

A row deduplicated at publish (another job holds its key) is marked published only when
that job will do the work (running, retrying) or did (succeeded). Under ``until_done``, a
holder that failed, was revoked or is unknown (lost, or queued: they look the same) may
hold a reservation nobody releases: the relay drops it and publishes the row for real;
a holder that was only queued makes the ledger skip the second message.

A publish that fails because the broker (or the store) is unreachable stops the batch;
the relay waits with capped, jittered backoff and tries again, rows untouched. Any other
failure (a payload the task no longer accepts, a task this app does not know) belongs to
the row: it is retried later with its own backoff and the other rows go on, until its
attempts run out (``conventions_outbox_max_attempts``, 10 by default: about half an hour
of backoff). Then the row is dead-lettered: a dead letter in the layer's store (category
``invalid`` for a bad payload or an unknown task), an audit event, ``failed_at`` set.

A row written by a newer release than this relay reads (``formats.OUTBOX_ROW``, carried
in the row's headers JSON) is neither published nor counted as an attempt: the relay
logs it as an error and looks at it again after ``NEWER_ROW_DELAY`` seconds, leaving it
to a relay of the new release (a rolling deploy's relays share the table).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import states

from conventions.config import extras, formats

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import sqlite
except ModuleNotFoundError as exc:  # the 'sql' extra
    raise extras.missing("sql", "the outbox relay") from exc

from conventions.app import App
from conventions.errors import ConfigurationError
from conventions.jobs.backoff import Backoff
from conventions.jobs.decisions import DEFAULT_TABLE, RetryDecision
from conventions.observability import audit
from conventions.store import keys
from conventions.store.records import utcnow
from conventions.store.sql import UTCDateTime
from conventions.task import ConventionTask
from conventions.tracing import headers as hdr
from conventions.tracing import logs

# the defaults live in the package (no SQLAlchemy there), re-exported here
from conventions.transactional import DEFAULT_BATCH as DEFAULT_BATCH  # noqa: PLC0414
from conventions.transactional import DEFAULT_MAX_ATTEMPTS as DEFAULT_MAX_ATTEMPTS  # noqa: PLC0414
from conventions.transactional import DEFAULT_MAX_BACKOFF as DEFAULT_MAX_BACKOFF  # noqa: PLC0414
from conventions.transactional import DEFAULT_POLL_INTERVAL as DEFAULT_POLL_INTERVAL  # noqa: PLC0414
from conventions.transactional import DEFAULT_RETENTION as DEFAULT_RETENTION  # noqa: PLC0414
from conventions.transactional import outbox

logger = logging.getLogger("conventions.transactional.relay")

#: a row whose publish failed for its own reason waits this much (doubling) before the next try
ROW_BACKOFF = Backoff(base=5.0, cap=600.0)
#: a holder in these states will still run the key: a row deduplicated against it is done
HOLDER_ALIVE = frozenset({states.RECEIVED, states.STARTED, states.RETRY})
#: seconds between two purges of a long-running relay
PURGE_INTERVAL = 3600.0
#: seconds the SQLite relay lease lasts without renewal
LEASE_SECONDS = 30.0
#: the longest error text kept on a row
MAX_ERROR = 2000
#: seconds before a relay looks again at a row a newer release wrote (no attempt spent)
NEWER_ROW_DELAY = 30.0

_lock_metadata = sa.MetaData()
#: SQLite only: the lease of the one relay allowed to publish
lock_table = sa.Table(
    "cc_outbox_relay",
    _lock_metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("lease_until", UTCDateTime(), nullable=False),
)


def row_fields(row: Any) -> dict[str, Any]:
    """The log fields of an outbox row: its job's correlation, task and key."""
    headers = row.headers or {}
    return {
        "correlation_id": headers.get(hdr.CORRELATION),
        "request_id": headers.get(hdr.REQUEST),
        "task": row.task,
        "version": logs.version_of(row.task),
        "task_id": row.task_id,
        "idempotency_key": row.idempotency_key,
    }


@dataclass
class Batch:
    """What one batch did."""

    claimed: int = 0
    published: int = 0
    #: published rows whose job was already pending (enqueue dedup answered its holder)
    deduplicated: int = 0
    #: rows whose publish failed for their own reason (retried later with backoff)
    failed: int = 0
    #: of the failed rows, those whose attempts ran out: dead-lettered, never tried again
    dead: int = 0
    #: the error that stopped the batch: the broker or the store is unreachable
    unavailable: str | None = None
    #: SQLite: another relay holds the lease, this one did nothing
    locked_out: bool = False
    #: rows written by a newer release than this relay reads: left for a newer relay
    newer: int = 0

    def add(self, other: Batch) -> None:
        self.claimed += other.claimed
        self.published += other.published
        self.deduplicated += other.deduplicated
        self.failed += other.failed
        self.dead += other.dead
        self.newer += other.newer
        self.unavailable = other.unavailable
        self.locked_out = other.locked_out


@dataclass
class _Marks:
    published: list[int] = field(default_factory=list)
    #: (row, error, delay in seconds or None to keep the row due)
    failed: list[tuple[Any, str, float | None]] = field(default_factory=list)
    #: (row, error): dead-lettered rows
    dead: list[tuple[Any, str]] = field(default_factory=list)
    #: (row, error): rows of a newer release, looked at again later, no attempt spent
    later: list[tuple[Any, str]] = field(default_factory=list)


class Relay:
    """Publishes the outbox of one database through one Celery app."""

    def __init__(
        self,
        app: App,
        engine: sa.Engine,
        *,
        batch: int = DEFAULT_BATCH,
        retention: timedelta = DEFAULT_RETENTION,
        owner: str | None = None,
        max_attempts: int | None = None,
    ) -> None:
        self.app = app
        configured = app.conf.get("conventions_outbox_max_attempts")
        self.max_attempts = int(max_attempts or configured or DEFAULT_MAX_ATTEMPTS)
        if self.max_attempts < 1:
            raise ConfigurationError("conventions_outbox_max_attempts must be at least 1")
        self.engine = engine
        self.batch = batch
        self.retention = retention
        self.owner = owner or uuid.uuid4().hex
        self.postgres = engine.dialect.name == "postgresql"
        #: the task ids published by the current batch (a holder among them is queued)
        self._batch_ids: set[str] = set()
        outbox.create_table(engine)
        if not self.postgres:
            _lock_metadata.create_all(engine, checkfirst=True)

    # -- one batch ---------------------------------------------------------------------
    def run_batch(self) -> Batch:
        """Claim, publish and mark one batch of due rows."""
        if self.postgres:
            with self.engine.begin() as conn:
                rows = conn.execute(self._due().with_for_update(skip_locked=True)).all()
                result, marks = self._publish_all(rows)
                self._mark(conn, marks)
            return result
        if not self._take_lease():
            return Batch(locked_out=True)
        with self.engine.connect().execution_options(cc_read_only=True) as conn:
            rows = conn.execute(self._due()).all()
            conn.rollback()
        result, marks = self._publish_all(rows)
        with self.engine.begin() as conn:
            self._mark(conn, marks)
        return result

    def _due(self) -> sa.Select[Any]:
        t = outbox.table
        return (
            sa.select(t)
            .where(t.c.published_at.is_(None), t.c.failed_at.is_(None))
            .where(t.c.next_attempt_at <= utcnow())
            .order_by(t.c.next_attempt_at, t.c.id)
            .limit(self.batch)
        )

    def _publish_all(self, rows: Sequence[Any]) -> tuple[Batch, _Marks]:
        result, marks = Batch(claimed=len(rows)), _Marks()
        self._batch_ids.clear()
        for row in rows:
            newer = formats.row_problem(row.headers)
            if newer is not None:  # not this relay's to read: a newer relay publishes it
                logger.error("outbox row %s (%s): %s", row.id, row.task, newer)
                result.newer += 1
                marks.later.append((row, str(newer)[:MAX_ERROR]))
                continue
            try:
                with logs.job_fields(**row_fields(row)):
                    deduplicated = self.publish(row)
            except Exception as exc:
                error = f"{type(exc).__qualname__}: {exc}"[:MAX_ERROR]
                if isinstance(DEFAULT_TABLE.decide(exc), RetryDecision):
                    # the broker or the store: not the row's fault, stop and wait
                    result.unavailable = error
                    marks.failed.append((row, error, None))
                    break
                result.failed += 1
                with logs.job_fields(**row_fields(row)):
                    if row.attempts + 1 >= self.max_attempts and self._dead_letter(row, exc, error):
                        result.dead += 1
                        marks.dead.append((row, error))
                        continue
                    logger.warning("outbox row %s (%s) not published: %s", row.id, row.task, error)
                marks.failed.append((row, error, ROW_BACKOFF.delay(row.attempts + 1)))
                continue
            result.published += 1
            result.deduplicated += int(deduplicated)
            marks.published.append(row.id)
        return result, marks

    def publish(self, row: Any) -> bool:
        """Publish one row with its own task id; True when enqueue dedup answered with
        a job that holds the key and will do the work (nothing new was enqueued)."""
        task = self.app.tasks.get(row.task)
        if not isinstance(task, ConventionTask):
            raise LookupError(
                f"task {row.task!r} is not a convention task of app {self.app.main!r}: "
                "run the relay with the app that declares it (-A)"
            )
        handle = self._apply(task, row)
        if getattr(handle, "deduplicated", False) and self._stale(task, row, str(handle.id)):
            handle = self._apply(task, row)  # the stale reservation is gone: for real
        return bool(getattr(handle, "deduplicated", False))

    def _apply(self, task: ConventionTask, row: Any) -> Any:
        handle = task.apply_async(
            kwargs=dict(row.kwargs),
            task_id=row.task_id,
            headers={k: v for k, v in row.headers.items() if k != formats.ROW_FIELD},
            idempotency_key=row.idempotency_key,
        )
        if not getattr(handle, "deduplicated", False):
            self._batch_ids.add(str(handle.id))
        return handle

    def _stale(self, task: ConventionTask, row: Any, holder: str) -> bool:
        """Whether the job holding the row's key may never do the row's work; its
        ``until_done`` reservation is then dropped. A holder this batch published, or
        one running or retrying, will do it; one that succeeded did (its leftover
        reservation is dropped too). One that failed, was revoked, or that the result
        backend does not know (lost, or still queued) may not."""
        if holder in self._batch_ids:
            return False
        if task.dedup != "until_done":
            return False  # a dedup window ("forever", a ttl) absorbs by declaration
        state = _state_of(task, holder)
        if state in HOLDER_ALIVE:
            return False
        body = task.upcast_into or task  # a row written before keys were namespaced: bare
        task.store.unreserve(keys.namespaced(body.name, row.idempotency_key), holder)
        if state == states.SUCCESS:
            return False
        logger.warning(
            "outbox row %s: its key is held by %s (%s), which will not run it: published",
            row.id, holder, state,
        )  # fmt: skip
        return True

    def _dead_letter(self, row: Any, exc: Exception, error: str) -> bool:
        """Write the dead letter of a row whose attempts ran out, then audit it; False
        (the row is retried later) when the store cannot take the record."""
        record = outbox.dead_letter_of(row, exc, error, row.attempts + 1)
        store = self.app.store
        try:
            store.put_dead_letter(record)
        except Exception:
            logger.exception("outbox row %s: could not write its dead letter", row.id)
            return False
        category = record.category
        detail = {"category": str(category), "dead_letter_id": record.id, "reason": record.message}
        audit.record(
            store, "dead_lettered", row.task, row.task_id, row.headers or {},
            attempt=row.attempts + 1, detail={**detail, "source": "outbox"},
        )  # fmt: skip
        logger.error(
            "outbox row %s (%s) dead-lettered as %s after %d attempts: %s",
            row.id, row.task, category, row.attempts + 1, error,
        )  # fmt: skip
        return True

    def _mark(self, conn: sa.Connection, marks: _Marks) -> None:
        t, now = outbox.table, utcnow()
        if marks.published:
            conn.execute(
                sa.update(t)
                .where(t.c.id.in_(marks.published))
                .values(published_at=now, last_error=None)
            )
        for row, error, delay in marks.failed:
            values: dict[str, Any] = {"attempts": t.c.attempts + 1, "last_error": error}
            if delay is not None:
                values["next_attempt_at"] = now + timedelta(seconds=delay)
            conn.execute(sa.update(t).where(t.c.id == row.id).values(**values))
        for row, error in marks.later:
            later = now + timedelta(seconds=NEWER_ROW_DELAY)
            postpone = {"last_error": error, "next_attempt_at": later}
            conn.execute(sa.update(t).where(t.c.id == row.id).values(**postpone))
        for row, error in marks.dead:
            dead = {"attempts": t.c.attempts + 1, "last_error": error, "failed_at": now}
            conn.execute(sa.update(t).where(t.c.id == row.id).values(**dead))

    # -- SQLite: one relay at a time ---------------------------------------------------
    def _take_lease(self) -> bool:
        now = utcnow()
        t = lock_table
        insert = sqlite.insert(t).values(
            name="relay", owner=self.owner, lease_until=now + timedelta(seconds=LEASE_SECONDS)
        )
        taken = insert.on_conflict_do_update(
            index_elements=[t.c.name],
            set_={"owner": insert.excluded.owner, "lease_until": insert.excluded.lease_until},
            where=sa.or_(t.c.lease_until < now, t.c.owner == self.owner),
        ).returning(t.c.name)
        with self.engine.begin() as conn:
            return conn.execute(taken).first() is not None

    def release(self) -> None:
        """Give the SQLite lease up (a stopping relay lets the next one start at once)."""
        if not self.postgres:
            with self.engine.begin() as conn:
                conn.execute(sa.delete(lock_table).where(lock_table.c.owner == self.owner))

    # -- loops ---------------------------------------------------------------------------
    def drain(self) -> Batch:
        """``--once``: publish batches until fewer than a full batch were due, or the
        broker is unreachable; purge old published rows first."""
        total = Batch()
        self.purge()
        while True:
            result = self.run_batch()
            total.add(result)
            _log(result)
            if result.unavailable or result.locked_out or result.claimed < self.batch:
                return total

    def run(
        self,
        stop: threading.Event,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
    ) -> None:
        """Publish until ``stop`` is set; back off while the broker or the database is
        unreachable; purge old published rows every ``PURGE_INTERVAL`` seconds."""
        backoff = Backoff(base=min(0.5, max_backoff), cap=max_backoff)
        failures, next_purge = 0, 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= next_purge:
                    self.purge()
                    next_purge = time.monotonic() + PURGE_INTERVAL
                result = self.run_batch()
            except sa.exc.DBAPIError as exc:
                result = Batch(unavailable=f"database: {type(exc).__qualname__}: {exc}")
            _log(result)
            if result.unavailable:
                failures += 1
                stop.wait(max(0.1, backoff.delay(failures)))
                continue
            failures = 0
            if result.claimed < self.batch:
                stop.wait(poll_interval * (5 if result.locked_out else 1))
        self.release()

    def purge(self) -> int:
        """Delete the rows published longer than the retention ago."""
        count = outbox.purge(self.engine, self.retention)
        if count:
            logger.info("purged %d published outbox rows", count)
        return count


def _log(result: Batch) -> None:
    if result.published or result.failed:
        logger.info(
            "outbox: published %d (%d deduplicated), failed %d (%d dead-lettered)",
            result.published,
            result.deduplicated,
            result.failed,
            result.dead,
        )
    if result.unavailable:
        logger.warning("outbox: broker unavailable, backing off: %s", result.unavailable)


def _state_of(task: ConventionTask, holder: str) -> str:
    """The holder's Celery state; ``PENDING`` (unknown) when the backend cannot say."""
    try:
        return str(task.AsyncResult(holder).state)
    except Exception:
        return "PENDING"
