"""Retention: how long dead letters, audit trails and runs are kept, and the purge behind it.

Runs (the run history, ``conventions.store.runs``) have their own setting,
``conventions_runs_retention_seconds`` (7 days): ``purge_runs`` deletes the runs created
before it (on Redis the ``conventions_runs_max`` cap bounds them as well).

Batches (``conventions.store.batches``) that ended before the dead-letter retention, with no
callback left due, go in the workers' purge (``purge_batches``): a member's dead letter can
be replayed into its batch as long as the record is kept.

``purge`` and ``purge_expired`` are what ``conventions retention`` runs. ``purge_expired``
is for the SQL store: its ledger, delivery counters, reservations, leases and state
records keep an expiry column instead of a Redis TTL, and the rows past it are deleted
here, in bounded batches, with the lifetimes Redis would give them (``ledger_keep``, the
delivery ttl, each lease's and record's own ttl). On Redis it has nothing to do.

Workers also run both on their own: on ``worker_ready`` (the main worker process, never
the pool children) a daemon thread purges at start and then every
``conventions_retention_interval_seconds``; it stops at ``worker_shutdown``. A failed
purge is logged and tried again at the next interval.

Several workers purging at once is harmless: a purge deletes what is older than a
cutoff, so it is idempotent. On Redis each batch is one Lua script (atomic), so two
workers delete disjoint batches; on SQL a ``DELETE ... WHERE`` waits for the other's row
locks and finds nothing left (an expired-row batch skips the rows others hold locked).
Only the counts in the logs are split between workers.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

from conventions.config.settings import (
    AUDIT_RETENTION,
    DEAD_LETTER_RETENTION,
    RETENTION_INTERVAL,
    RUNS_RETENTION,
)
from conventions.store.base import Store
from conventions.store.records import utcnow

if TYPE_CHECKING:
    from celery import Celery as App  # an App: its ``store`` and ``conventions_settings``

__all__ = [
    "AUDIT_RETENTION",
    "DEAD_LETTER_RETENTION",
    "RETENTION_INTERVAL",
    "RUNS_RETENTION",
    "Purger",
    "purge",
    "purge_batches",
    "purge_expired",
    "purge_runs",
    "start",
    "stop",
]

logger = logging.getLogger("conventions.ops.retention")


def purge(store: Store, *, dead_letters: timedelta, audit: timedelta) -> tuple[int, int]:
    """Delete dead letters last failed before ``dead_letters`` ago and audit trails idle
    since before ``audit`` ago; return (dead letters, audit events) deleted."""
    now = utcnow()
    return store.purge_dead_letters(now - dead_letters), store.purge_audit(now - audit)


def purge_batches(store: Store, dead_letters: timedelta) -> int:
    """Delete the batches that ended before ``dead_letters`` ago (kept as long as their
    members' dead letters can be replayed) with no callback left due; return how many."""
    return store.purge_batches(utcnow() - dead_letters)


def purge_runs(store: Store, runs: timedelta) -> int:
    """Delete the runs created before ``runs`` ago; return how many."""
    return store.purge_runs(utcnow() - runs)


def purge_expired(store: Store) -> dict[str, int]:
    """Delete the SQL store's rows past their own expiry; how many, per table (nothing on
    Redis, which expires them by TTL)."""
    purge_rows = getattr(store, "purge_expired", None)  # the SQL store's only
    return dict(purge_rows()) if purge_rows is not None else {}


class Purger:
    """A daemon thread that purges ``app.store`` at start, then every ``interval``."""

    def __init__(
        self,
        app: App,
        *,
        dead_letters: timedelta,
        audit: timedelta,
        interval: timedelta,
        runs: timedelta = RUNS_RETENTION,
    ) -> None:
        self.app = app
        self.dead_letters = dead_letters
        self.audit = audit
        self.runs = runs
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="conventions-retention")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the purge in progress, if any (waits at most ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run_once(self) -> tuple[int, int] | None:
        """One purge (dead letters, audit trails, runs, then expired SQL rows); the first
        two counts, or None when it failed (logged, never raised)."""
        try:
            counts = purge(self.app.store, dead_letters=self.dead_letters, audit=self.audit)
            runs = purge_runs(self.app.store, self.runs)
            batches = purge_batches(self.app.store, self.dead_letters)
            expired = purge_expired(self.app.store)
        except Exception:
            logger.exception("retention: purge failed; next try in %s", self.interval)
            return None
        logger.info("retention: deleted %d dead letters, %d audit events, %d runs and %d "
                    "batches", *counts, runs, batches)  # fmt: skip
        if expired:
            logger.info("retention: deleted expired rows %s", _rows(expired))
        return counts

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval.total_seconds())


def _rows(expired: dict[str, int]) -> str:
    return ", ".join(f"{table}={count}" for table, count in expired.items())


_purgers: dict[int, Purger] = {}
_lock = threading.Lock()


def start(app: App) -> Purger | None:
    """Start ``app``'s purger (once per app and process), unless retention is off."""
    conf = app.conventions_settings
    if not conf.retention_enabled:
        return None
    with _lock:
        current = _purgers.get(id(app))
        if current is not None and current.alive:
            return current
        purger = Purger(
            app,
            dead_letters=timedelta(seconds=conf.dead_letter_retention),
            audit=timedelta(seconds=conf.audit_retention),
            interval=timedelta(seconds=conf.retention_interval),
            runs=timedelta(seconds=conf.runs_retention),
        )
        _purgers[id(app)] = purger
        purger.start()
        return purger


def stop(app: App) -> None:
    """Stop ``app``'s purger, if it runs."""
    with _lock:
        purger = _purgers.pop(id(app), None)
    if purger is not None:
        purger.stop()
