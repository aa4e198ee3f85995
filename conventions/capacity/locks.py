"""Locks that never stay stuck: named leases in the store, renewed while held.

Two ways in, one namespace (``lock:{name}``), so they exclude each other:

* ``@app.job(..., exclusive="customer:{customer_id}")``: at most one job per key runs
  at a time, across every worker. A delivery that finds the key taken is deferred
  (published again later, no attempt spent), never run alongside and never dropped.
* ``with mutex(store, "customer:cus_0001"):`` a critical section anywhere (a job body,
  a script, a web request). When the lock stays taken, ``LockBusy`` is raised: in a job
  it is a ``TransientError``, so the job is retried with backoff.

The lease is short and the lease keeper renews it every third of its length while the
holder runs, so a long holder keeps it and a crashed one (kill -9, a lost machine)
frees it when the lease runs out: nobody has to unlock by hand.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conventions.capacity.leases import keeper
from conventions.errors import LockBusy
from conventions.store.base import Store

logger = logging.getLogger("conventions.capacity.locks")

#: the lease name prefix shared by exclusive jobs and ``mutex``
PREFIX = "lock:"
#: seconds a lock's lease lasts between renewals when the caller gives none
DEFAULT_TTL = 30.0


def lease_name(name: str) -> str:
    """The store lease behind lock ``name``."""
    return PREFIX + name


def exclusive_name(template: str | None, payload: Any) -> str | None:
    """The lock a job of ``payload`` takes for its ``exclusive=`` template, or None."""
    if not template:
        return None
    return template.format(**payload.model_dump(mode="json"))


def take(store: Store, name: str, owner: str, ttl: float) -> str | None:
    """Take lock ``name`` for ``owner`` and keep it renewed; None when taken, else the
    holder (nothing is held then)."""
    holder = store.acquire(lease_name(name), owner, ttl)
    if holder is None:
        keeper.hold_lease(store, lease_name(name), owner, ttl)
    return holder


def give_back(store: Store, name: str, owner: str) -> None:
    """Stop renewing and release lock ``name``; a failure is logged (the lease expires)."""
    keeper.drop_lease(lease_name(name), owner)
    try:
        store.release_lease(lease_name(name), owner)
    except Exception:
        logger.warning("could not release lock %s; it frees itself when its lease runs out",
                       name, exc_info=True)  # fmt: skip


@contextmanager
def mutex(
    store: Store, name: str, ttl: float = DEFAULT_TTL, *, wait: float = 0.0, poll: float = 0.1
) -> Iterator[str]:
    """Hold lock ``name`` for the ``with`` block; yields the owner id.

    Waits up to ``wait`` seconds for a busy lock, then raises ``LockBusy`` (naming the
    holder). ``ttl`` bounds how long a crashed holder keeps the lock; while the block
    runs, the lease keeper renews it.
    """
    if not ttl > 0:
        raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
    owner = uuid.uuid4().hex
    deadline = time.monotonic() + max(wait, 0.0)
    while (holder := take(store, name, owner, ttl)) is not None:
        if time.monotonic() >= deadline:
            raise LockBusy(name=name, holder=holder, retry_after=min(ttl, 60.0) / 2)
        time.sleep(poll)
    try:
        yield owner
    finally:
        give_back(store, name, owner)
