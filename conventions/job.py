"""What a job body gets besides its payload: the job context, and the lease keeper.

The body is ``def body(payload, ctx)``. ``ctx`` carries the idempotency key to hand to
providers (an ``Idempotency-Key`` header, a deterministic Message-ID), the attempt, the
correlation context, and ``is_stopping()`` for long jobs that should stop at a clean
point during a deploy.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from conventions.context import Trace
from conventions.store.base import Store

logger = logging.getLogger("conventions.job")

_stopping = threading.Event()


def mark_stopping() -> None:
    """Called when the worker starts a warm shutdown: running jobs see ``is_stopping()``."""
    _stopping.set()


@dataclass
class JobContext:
    """The running job, as its body sees it."""

    task: str
    task_id: str
    #: stable across retries, redeliveries and replays: give it to providers
    idempotency_key: str
    #: 1 on the first run, 2 on the first retry, ...
    attempt: int
    trace: Trace
    #: True when the previous attempt ended with an uncertain outcome: reconcile first
    reconcile_first: bool = False
    #: the dead-letter id this run was replayed from, if any
    replay_of: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def correlation_id(self) -> str:
        return self.trace.correlation_id

    def is_stopping(self) -> bool:
        """True once the worker is shutting down: save a checkpoint and return soon."""
        return _stopping.is_set()


class LeaseKeeper:
    """One daemon thread per process that renews the ledger leases of running jobs.

    Leases are short (so a crashed owner is taken over quickly) and renewed every third
    of their length while the job runs, so a long job never loses its claim.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, str], tuple[Store, float]] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def hold(self, store: Store, key: str, owner: str, lease: float) -> None:
        with self._lock:
            self._leases[(key, owner)] = (store, lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="conventions-lease-keeper", daemon=True
                )
                self._thread.start()

    def drop(self, key: str, owner: str) -> None:
        with self._lock:
            self._leases.pop((key, owner), None)

    def _held(self, key: str, owner: str) -> bool:
        with self._lock:
            return (key, owner) in self._leases

    def _run(self) -> None:
        while True:
            with self._lock:
                items = list(self._leases.items())
            interval = min((lease for _, lease in (v for _, v in items)), default=10.0) / 3
            self._wake.wait(max(interval, 0.05))
            for (key, owner), (store, lease) in items:
                if not self._held(key, owner):
                    continue  # the job finished since the snapshot
                try:
                    if not store.renew(key, owner, lease) and self._held(key, owner):
                        logger.warning("lease of %s lost by %s", key, owner)
                        self.drop(key, owner)
                except Exception:
                    logger.exception("could not renew the lease of %s", key)


#: the process-wide keeper (prefork children each get their own after fork)
keeper = LeaseKeeper()
