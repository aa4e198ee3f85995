"""The lease keeper: one thread per process that renews the leases running jobs hold.

Two kinds: the ledger claim of a job's idempotency key and named leases (per-key locks,
concurrency slots). The run path (``conventions.worker``), the locks and the dependency
limits hand their leases to the one :data:`keeper` of the process.
"""

from __future__ import annotations

import logging
import threading

from conventions.store import keys
from conventions.store.base import Store

logger = logging.getLogger("conventions.capacity.leases")


class LeaseKeeper:
    """One daemon thread per process that renews the leases of running jobs.

    Two kinds: the ledger claim of a job's idempotency key (``hold``) and named leases
    (``hold_lease``: per-key locks, concurrency slots). Leases are short (so a crashed
    owner is taken over quickly) and renewed every third of their length while held, so a
    long job never loses them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (kind, name, owner) -> (store, ttl, batch home); kind is "ledger" or "lease"; the
        #: batch home of a member's claim (:func:`conventions.store.keys.batch_home`)
        self._leases: dict[tuple[str, str, str], tuple[Store, float, tuple[str, str] | None]] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        #: how long the thread sleeps between renewals now
        self._interval = 10.0

    def hold(self, store: Store, key: str, owner: str, lease: float) -> None:
        """Keep renewing the ledger claim of ``key`` until ``drop``."""
        self._add(("ledger", key, owner), store, lease)

    def drop(self, key: str, owner: str) -> None:
        self._remove(("ledger", key, owner))

    def hold_lease(self, store: Store, name: str, owner: str, ttl: float) -> None:
        """Keep renewing the named lease ``name`` until ``drop_lease``."""
        self._add(("lease", name, owner), store, ttl)

    def drop_lease(self, name: str, owner: str) -> None:
        self._remove(("lease", name, owner))

    def _add(self, item: tuple[str, str, str], store: Store, ttl: float) -> None:
        with self._lock:
            self._leases[item] = (store, ttl, keys.current_home())
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="conventions-lease-keeper", daemon=True
                )
                self._thread.start()
            elif ttl / 3 < self._interval:
                self._wake.set()  # sleeping too long for this lease: plan again, renew later

    def _remove(self, item: tuple[str, str, str]) -> None:
        with self._lock:
            self._leases.pop(item, None)

    def _held(self, item: tuple[str, str, str]) -> bool:
        with self._lock:
            return item in self._leases

    def _run(self) -> None:
        while True:
            with self._lock:
                items = list(self._leases.items())
                self._interval = max(
                    min((ttl for _, ttl, _ in self._leases.values()), default=30.0) / 3, 0.05
                )
            if self._wake.wait(self._interval):
                self._wake.clear()
                continue
            for item, (store, ttl, home) in items:
                if self._held(item):  # else it was dropped since the snapshot
                    with keys.batch_home(*(home or (None, None))):
                        self._renew(item, store, ttl)

    def _renew(self, item: tuple[str, str, str], store: Store, ttl: float) -> None:
        kind, name, owner = item
        try:
            renew = store.renew if kind == "ledger" else store.renew_lease
            if not renew(name, owner, ttl) and self._held(item):
                logger.warning("%s lease of %s lost by %s", kind, name, owner)
                self._remove(item)
        except Exception:
            logger.exception("could not renew the %s lease of %s", kind, name)


#: the process-wide keeper (prefork children each get their own after fork)
keeper = LeaseKeeper()
