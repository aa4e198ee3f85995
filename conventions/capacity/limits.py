"""Named dependency limits shared by every worker: a rate and a concurrency cap.

Celery's ``rate_limit`` counts per worker process, and a rate-limited job holds its
prefetch slot while it waits. These limits are held in the store instead, so every
worker of the fleet shares them, and a job that cannot go now is deferred (published
again with a countdown, no attempt spent) instead of sleeping in its slot. Declare each
dependency once, in ``celeryconfig.py``::

    conventions_limits = {
        "smtp": "5/s",                             # a rate: one token every 0.2 s
        "payments_api": {"concurrency": 2},        # at most 2 calls at once, fleet-wide
        "crm": {"rate": "100/m", "burst": 10, "concurrency": 4, "lease": 15},
    }

and name the dependencies a task calls: ``@app.job(..., uses=("smtp",))``. Before the
body runs (and before the ledger claim, so a deferral never counts as a delivery) the
runner takes a token of each rate and a slot of each cap; slots are leases renewed by
the lease keeper and released after the body, so a worker that dies frees them within
``lease`` seconds. A body that gets HTTP 429 pauses the dependency's bucket for
everyone, for its Retry-After (or one interval); :func:`pause` does it by hand.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from celery.exceptions import Ignore, Reject

from conventions.capacity.leases import keeper
from conventions.config.capacity import Limit
from conventions.jobs import decisions
from conventions.tracing import headers as hdr

if TYPE_CHECKING:
    from conventions.jobs.protocol import JobTask
    from conventions.store.base import Store


class Delivery(Protocol):
    """What the limiter uses of a delivery (:class:`conventions.worker.delivery.Delivery`):
    its task and body, its headers (the limiter's state rides in one), its owner (slot
    leases are held in its name), and its deferral."""

    @property
    def task(self) -> JobTask: ...
    @property
    def body(self) -> JobTask: ...
    @property
    def headers(self) -> dict[str, Any]: ...
    @property
    def owner(self) -> str: ...
    def defer(
        self, reason: str, *, store_down: bool = False, countdown: float | None = None
    ) -> NoReturn: ...


logger = logging.getLogger("conventions.capacity.limits")

#: first and longest delay before a job that found every slot taken tries again
SLOT_WAIT_BASE = 0.25
SLOT_WAIT_CAP = 5.0
#: the message header that carries the limiter's state across deferrals
HEADER = hdr.LIMITS


def pause(store: Store, limit: Limit, seconds: float) -> None:
    """Hold every token of ``limit`` back for ``seconds``, for every worker: call it when a
    dependency says "slow down" in a way the layer cannot see (an SMTP 421, a quota
    error in a response body). Jobs waiting on it are deferred, never blocked."""
    store.pause_tokens(limit.bucket, max(0.0, seconds))
    logger.warning("dependency %s paused for %.1fs", limit.name, seconds)


@contextlib.contextmanager
def admitted(delivery: Delivery) -> Iterator[None]:
    """Run the block once the delivery holds a token of every rate and a slot of every
    cap its task uses; else defer the delivery (``Delivery.defer`` raises)."""
    uses: tuple[str, ...] = tuple(getattr(delivery.body, "uses", ()) or ())
    if not uses:
        yield
        return
    declared = delivery.task.settings.limits
    limits = [declared[name] for name in uses]
    store, state = delivery.task.store, dict(delivery.headers.pop(HEADER, None) or {})
    try:
        _take_tokens(delivery, store, limits, state)
        slots = _take_slots(delivery, store, limits, state)
    except (Ignore, Reject):  # deferred
        raise
    except Exception as exc:
        delivery.defer(f"the store is unavailable ({type(exc).__qualname__})", store_down=True)
    try:
        yield
    except BaseException as exc:
        _tighten(store, limits, exc)
        raise
    finally:
        for name in slots:
            keeper.drop_lease(name, delivery.owner)
            with contextlib.suppress(Exception):  # expiry frees it anyway
                store.release_lease(name, delivery.owner)


def _max_wait(delivery: Delivery) -> float:
    return max(1.0, delivery.task.settings.max_countdown - 1.0)


def _take_tokens(
    delivery: Delivery, store: Store, limits: list[Limit], state: dict[str, Any]
) -> None:
    """A token of every bucket (a cap-only dependency's bucket only holds 429 pauses)."""
    max_wait, booked = _max_wait(delivery), set(state.get("booked") or ())
    waits: dict[str, float] = {}
    for limit in limits:
        was_booked = limit.name in booked
        wait = store.take_token(
            limit.bucket, limit.interval or 0.0, limit.burst, max_wait, was_booked
        )
        if wait > 0:
            waits[limit.name] = wait
            if was_booked or wait <= max_wait:
                booked.add(limit.name)
        else:
            booked.discard(limit.name)
    if not waits:
        return
    longest = max(waits.values())
    countdown = longest if longest <= max_wait else max_wait * random.uniform(0.5, 1.0)
    waiting = sorted(booked & set(waits))
    delivery.headers[HEADER] = {"booked": waiting, "waits": state.get("waits", 0)}
    delivery.defer(f"rate limit of {', '.join(sorted(waits))}", countdown=countdown + 0.005)


def _take_slots(
    delivery: Delivery, store: Store, limits: list[Limit], state: dict[str, Any]
) -> list[str]:
    """A slot of every cap, all or none: the keeper renews them only once all are held.

    A refusal (a cap is full) or an error (the store failed between two acquisitions)
    gives back every slot already taken, at once, and none ever reached the keeper: a
    slot left held would be renewed for the life of the worker, one less for the fleet.
    """
    held: list[tuple[str, float]] = []
    try:
        for limit in limits:
            if not limit.concurrency:
                continue
            slot = store.acquire_any(limit.slots(), delivery.owner, limit.lease)
            if slot is None:
                _give_back(store, held, delivery.owner)
                _defer_for_slot(delivery, limit, state)
            held.append((slot, limit.lease))
    except BaseException:
        _give_back(store, held, delivery.owner)
        raise
    for slot, lease in held:
        keeper.hold_lease(store, slot, delivery.owner, lease)
    return [slot for slot, _ in held]


def _give_back(store: Store, held: list[tuple[str, float]], owner: str) -> None:
    """Release slots that never reached the keeper (one the store cannot release now
    expires after its lease, unrenewed)."""
    while held:
        name, _ = held.pop()
        with contextlib.suppress(Exception):
            store.release_lease(name, owner)


def _defer_for_slot(delivery: Delivery, limit: Limit, state: dict[str, Any]) -> NoReturn:
    waits = int(state.get("waits", 0)) + 1
    delivery.headers[HEADER] = {"waits": waits}
    countdown = min(SLOT_WAIT_CAP, SLOT_WAIT_BASE * 2 ** min(waits, 8))
    delivery.defer(
        f"{limit.name} is at its cap of {limit.concurrency} at once",
        countdown=countdown * random.uniform(0.5, 1.0),
    )


def _tighten(store: Store, limits: list[Limit], exc: BaseException) -> None:
    """A 429 from the body pauses every bucket the task uses, for the Retry-After or one
    interval (one second without a rate). The body's exception is found in the chain of
    what reached here (Celery's ``Retry`` keeps only a pickle-safe copy of it)."""
    original = _http_429(exc)
    if original is None:
        return
    after = decisions.parse_retry_after(decisions.retry_after_header(original))
    for limit in limits:
        seconds = after if after is not None else (limit.interval or 1.0)
        with contextlib.suppress(Exception):
            pause(store, limit, seconds)


def _http_429(exc: BaseException | None) -> BaseException | None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if decisions.http_status(exc) == 429:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
