"""The worker's side of the schedules: overlap policies and the last-success record.

A job sent by a schedule entry carries ``cc_schedule`` (the entry), ``cc_occurrence``
(its scheduled time) and ``cc_overlap`` (the policy). ``run`` wraps its body:

- ``skip``: the run takes the named lease ``overlap:<entry>`` (renewed by the lease
  keeper while the body runs). A run that finds it held ends as ``skipped`` (a
  ``SkipJob``: a readable state, not a failure), so two runs never overlap.
- ``replace``: latest wins. Each send records the newest occurrence in the state
  document ``schedule:latest:<entry>``; an older run sees ``ctx.is_stopping()`` turn
  True and should return soon (it then ends as ``skipped``, "replaced"), an older one
  that has not started yet is skipped at once, and the newer run waits for the lease
  (``replace_wait``, else it is retried later).
- ``allow``: runs overlap freely.

Every success records ``schedule:last_success:<entry>``, which the watchdog reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from conventions.capacity.leases import keeper
from conventions.errors import SkipJob, TransientError
from conventions.store.base import Store
from conventions.store.records import utcnow
from conventions.tracing import headers as hdr
from conventions.worker.job_context import JobContext

T = TypeVar("T")

logger = logging.getLogger("conventions.schedules.overlap")

#: ``replace``: the longest the newer run waits for the older to stop (seconds)
REPLACE_WAIT = 30.0
#: ``replace``: how often a running job looks for a newer occurrence (seconds)
STOP_POLL = 1.0


def lease_name(entry: str) -> str:
    return f"overlap:{entry}"


def last_success_name(entry: str) -> str:
    return f"schedule:last_success:{entry}"


def latest_name(entry: str) -> str:
    return f"schedule:latest:{entry}"


def last_success(store: Store, entry: str) -> dict[str, Any] | None:
    """The newest succeeded occurrence of ``entry``: ``occurrence``, ``task_id``, ``at``."""
    return store.get_state(last_success_name(entry))


def announce(store: Store, entry: str, occurrence: str) -> None:
    """Record ``occurrence`` (ISO, UTC) as the newest of a ``replace`` entry."""
    current = store.get_state(latest_name(entry))
    if current is None or str(current.get("occurrence", "")) < occurrence:
        store.put_state(latest_name(entry), {"occurrence": occurrence}, None)


def _newer(store: Store, entry: str, mine: str) -> str | None:
    current = store.get_state(latest_name(entry))
    newest = str((current or {}).get("occurrence", ""))
    return newest if newest > mine else None


def run(
    store: Store,
    headers: Mapping[str, Any],
    ctx: JobContext,
    lease: float,
    body: Callable[[], T],
) -> T:
    """Run ``body`` under the entry's overlap policy (a job from no entry just runs)."""
    entry = headers.get(hdr.SCHEDULE)
    if not entry:
        return body()
    occurrence = str(headers.get(hdr.OCCURRENCE) or "")
    policy = headers.get(hdr.OVERLAP) or "allow"
    if policy == "allow":
        result = body()
    elif policy == "replace":
        result = _replace(store, str(entry), occurrence, ctx, lease, body)
    else:
        result = _skip(store, str(entry), ctx, lease, body)
    _record_success(store, str(entry), occurrence, ctx.task_id)
    return result


def _skip(store: Store, entry: str, ctx: JobContext, lease: float, body: Callable[[], T]) -> T:
    name = lease_name(entry)
    holder = store.acquire(name, ctx.task_id, lease)
    if holder is not None:
        raise SkipJob(f"overlap: the previous run of {entry} ({holder}) is still going")
    return _holding(store, name, ctx.task_id, lease, body)


def _replace(  # noqa: PLR0917
    store: Store, entry: str, mine: str, ctx: JobContext, lease: float, body: Callable[[], T]
) -> T:
    newer = _newer(store, entry, mine)
    if newer:
        raise SkipJob(f"replaced: a newer occurrence of {entry} ({newer}) was sent")
    announce(store, entry, mine)  # the older run stops even if beat's mark was lost
    name = lease_name(entry)
    deadline = time.monotonic() + REPLACE_WAIT
    while (holder := store.acquire(name, ctx.task_id, lease)) is not None:
        if time.monotonic() > deadline:
            raise TransientError(f"the previous run of {entry} ({holder}) did not stop in time")
        time.sleep(0.2)
    seen: dict[str, str] = {}
    checked = [0.0]

    def stop_check() -> bool:
        if "newer" not in seen and time.monotonic() - checked[0] >= STOP_POLL:
            checked[0] = time.monotonic()
            newer = _newer(store, entry, mine)
            if newer:
                seen["newer"] = newer
        return "newer" in seen

    ctx.stop_check = stop_check
    result = _holding(store, name, ctx.task_id, lease, body)
    if "newer" in seen:
        raise SkipJob(f"replaced: stopped for a newer occurrence of {entry} ({seen['newer']})")
    return result


def _holding(store: Store, name: str, owner: str, lease: float, body: Callable[[], T]) -> T:
    keeper.hold_lease(store, name, owner, lease)
    try:
        return body()
    finally:
        keeper.drop_lease(name, owner)
        try:  # a store error must not replace the body's outcome: the lease runs out
            store.release_lease(name, owner)
        except Exception:
            logger.warning("could not release %s; it frees itself when its lease runs out",
                           name, exc_info=True)  # fmt: skip


def _record_success(store: Store, entry: str, occurrence: str, task_id: str) -> None:
    """Keep the newest succeeded occurrence (an older one finishing late does not win).
    Never raises: the body succeeded, a store error here must not run it again."""
    try:
        current = last_success(store, entry)
        if current is not None and str(current.get("occurrence", "")) > occurrence:
            return
        store.put_state(
            last_success_name(entry),
            {"occurrence": occurrence, "task_id": task_id, "at": utcnow().isoformat()},
            None,
        )
    except Exception:
        logger.exception("could not record the success of %s %s", entry, occurrence)
