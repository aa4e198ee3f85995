# ruff: noqa: F811  (the contract suite's fixtures, imported by name)
"""The store contract for dependency limits (token buckets and slot leases), on every
backend: the contract suite's own Redis prefix, PostgreSQL tables and SQLite file."""

from __future__ import annotations

import itertools
import time

from conventions.store import Store
from tests.integration.test_store_contract import (  # noqa: F401  (fixtures)
    LONG,
    at_once,
    cluster_backend,
    postgresql_backend,
    redis_backend,
    sqlite_backend,
    store,
)

#: one token every 0.2 s, like a "5/s" limit
INTERVAL = 0.2


def test_a_fresh_bucket_gives_its_burst_at_once_then_asks_to_wait(store: Store) -> None:
    waits = [store.take_token("smtp", INTERVAL, 3, 0.0, False) for _ in range(4)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert 0.0 < waits[3] <= INTERVAL + 0.05


def test_waiting_callers_book_places_in_line_one_interval_apart(store: Store) -> None:
    assert store.take_token("smtp", INTERVAL, 1, LONG, False) == 0.0
    # each wait counts from its own call: the places it books are the call's time plus
    # its wait, known to within the call's own round trip (a loaded machine's calls are
    # tens of milliseconds apart, which the waits alone would count as a shorter gap)
    places = [_booked(store) for _ in range(3)]
    assert places[0][2] > 0.1
    for (low, high, _), (next_low, next_high, _) in itertools.pairwise(places):
        # the gap between two places lies between these two, and is one interval
        assert next_low - high - 0.05 < INTERVAL < next_high - low + 0.05, places


def _booked(store: Store) -> tuple[float, float, float]:
    """A place in line: the earliest and latest clock time it can be due at (the call's
    start and end plus the wait), and the wait."""
    start = time.monotonic()
    wait = store.take_token("smtp", INTERVAL, 1, LONG, False)
    end = time.monotonic()
    return start + wait, end + wait, wait


def test_a_wait_beyond_max_wait_books_nothing(store: Store) -> None:
    assert store.take_token("smtp", 1.0, 1, LONG, False) == 0.0
    assert store.take_token("smtp", 1.0, 1, 0.5, False) > 0.5  # not booked...
    assert store.take_token("smtp", 1.0, 1, LONG, False) < 1.05  # ...so the next is first


def test_a_booked_caller_takes_its_token_when_due_and_not_before(store: Store) -> None:
    assert store.take_token("smtp", INTERVAL, 1, LONG, False) == 0.0
    wait = store.take_token("smtp", INTERVAL, 1, LONG, False)
    assert store.take_token("smtp", INTERVAL, 1, LONG, True) > 0.0  # too early
    time.sleep(wait + 0.01)
    assert store.take_token("smtp", INTERVAL, 1, LONG, True) == 0.0


def test_a_newcomer_does_not_jump_the_line(store: Store) -> None:
    store.take_token("smtp", INTERVAL, 1, LONG, False)
    first = store.take_token("smtp", INTERVAL, 1, LONG, False)
    time.sleep(first + 0.01)
    # the booked caller has not come back yet: a newcomer still queues behind it
    assert store.take_token("smtp", INTERVAL, 1, LONG, False) > 0.0
    assert store.take_token("smtp", INTERVAL, 1, LONG, True) == 0.0


def test_fifty_concurrent_takers_get_exactly_the_burst(store: Store) -> None:
    waits = at_once(50, lambda _: store.take_token("smtp", 1.0, 5, 0.0, False))
    assert waits.count(0.0) == 5


def test_buckets_are_independent(store: Store) -> None:
    assert store.take_token("smtp", 1.0, 1, 0.0, False) == 0.0
    assert store.take_token("crm", 1.0, 1, 0.0, False) == 0.0


def test_a_pause_holds_every_token_back_and_never_shortens(store: Store) -> None:
    store.pause_tokens("smtp", 0.5)
    store.pause_tokens("smtp", 0.1)  # shorter: the 0.5 s pause stands
    wait = store.take_token("smtp", INTERVAL, 5, 0.0, False)
    assert 0.3 < wait <= 0.55
    assert 0.3 < store.take_token("smtp", INTERVAL, 5, 0.0, True) <= 0.55
    time.sleep(wait + 0.02)
    assert store.take_token("smtp", INTERVAL, 5, 0.0, False) == 0.0


def test_a_pause_applies_to_a_bucket_without_a_rate(store: Store) -> None:
    assert store.take_token("payments", 0.0, 1, 0.0, False) == 0.0
    store.pause_tokens("payments", 0.3)
    assert store.take_token("payments", 0.0, 1, 0.0, False) > 0.2


def test_acquire_any_takes_the_first_free_slot_and_none_when_all_are_held(store: Store) -> None:
    slots = ["limit:api:0", "limit:api:1"]
    assert store.acquire_any(slots, "a", LONG) == "limit:api:0"
    assert store.acquire_any(slots, "b", LONG) == "limit:api:1"
    assert store.acquire_any(slots, "c", LONG) is None
    assert store.release_lease("limit:api:0", "a")
    assert store.acquire_any(slots, "c", LONG) == "limit:api:0"
    assert store.lease_holder("limit:api:0") == "c"


def test_thirty_concurrent_acquires_of_three_slots_give_three(store: Store) -> None:
    slots = [f"limit:api:{i}" for i in range(3)]
    got = at_once(30, lambda i: store.acquire_any(slots, f"owner-{i}", LONG))
    assert sorted(name for name in got if name) == slots
