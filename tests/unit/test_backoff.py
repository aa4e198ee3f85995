"""Backoff: capped exponential ceilings, full jitter, requested delays, broker clamp."""

from __future__ import annotations

import os
import random
from dataclasses import FrozenInstanceError
from statistics import mean

import pytest

from conventions.backoff import Backoff
from conventions.errors import ConfigurationError

BACKOFF = Backoff(base=2.0, cap=60.0, max_attempts=8)


def draws(backoff: Backoff, attempt: int, n: int = 200, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [backoff.delay(attempt, rng) for _ in range(n)]


@pytest.mark.parametrize("attempt", range(1, 12))
def test_every_delay_lies_between_zero_and_the_capped_exponential_ceiling(attempt: int) -> None:
    ceiling = min(BACKOFF.cap, BACKOFF.base * 2 ** (attempt - 1))
    assert BACKOFF.ceiling(attempt) == ceiling
    assert all(0.0 <= d <= ceiling for d in draws(BACKOFF, attempt))


def test_the_first_retry_is_bounded_by_base() -> None:
    assert max(draws(BACKOFF, 1)) <= BACKOFF.base


def test_delays_grow_in_expectation_until_the_cap() -> None:
    means = [mean(draws(BACKOFF, attempt, n=2000)) for attempt in range(1, 6)]
    assert means == sorted(means)
    assert means[4] > 4 * means[0]


def test_delays_are_jittered_not_all_equal_over_50_draws() -> None:
    assert len(set(draws(BACKOFF, 3, n=50))) > 1


def test_delays_are_capped_however_many_attempts() -> None:
    for attempt in (7, 10, 100, 5000):
        assert BACKOFF.ceiling(attempt) == BACKOFF.cap
        assert all(d <= BACKOFF.cap for d in draws(BACKOFF, attempt, n=50))


def test_a_seeded_rng_makes_delays_reproducible() -> None:
    assert draws(BACKOFF, 4, n=10, seed=1) == draws(BACKOFF, 4, n=10, seed=1)


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="counts from 1"):
        BACKOFF.delay(0)


def test_a_requested_delay_is_honoured_never_shortened_by_the_backoff() -> None:
    rng = random.Random(3)
    for attempt in range(1, 8):
        assert BACKOFF.countdown(attempt, 45.0, limit=3600, rng=rng) >= 45.0


def test_the_backoff_still_applies_when_longer_than_the_requested_delay() -> None:
    tiny = 0.001
    countdowns = [BACKOFF.countdown(6, tiny, 3600, random.Random(seed)) for seed in range(50)]
    assert max(countdowns) > 1.0


def test_without_a_requested_delay_the_countdown_is_the_jittered_backoff() -> None:
    assert BACKOFF.countdown(3, None, 3600, random.Random(5)) == BACKOFF.delay(3, random.Random(5))


def test_the_countdown_is_clamped_to_the_broker_limit() -> None:
    assert BACKOFF.countdown(10, None, 5.0, random.Random(0)) <= 5.0
    assert BACKOFF.countdown(1, 7200.0, 3000.0) == 3000.0


def test_a_nan_requested_delay_is_ignored() -> None:
    countdown = BACKOFF.countdown(2, float("nan"), 100.0, random.Random(1))
    assert 0.0 <= countdown <= BACKOFF.ceiling(2)


def test_a_non_positive_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        BACKOFF.countdown(1, None, 0.0)


def test_backoff_is_a_frozen_value() -> None:
    with pytest.raises(FrozenInstanceError):
        BACKOFF.base = 5.0  # type: ignore[misc]


def test_computing_delays_does_not_touch_the_global_random_state() -> None:
    random.seed(42)
    expected = random.random()
    random.seed(42)
    BACKOFF.delay(3)
    BACKOFF.countdown(3, None, 100.0)
    assert random.random() == expected


def test_defaults_are_one_second_ten_minutes_and_five_attempts() -> None:
    assert Backoff() == Backoff(base=1.0, cap=600.0, max_attempts=5)


@pytest.mark.parametrize(
    "kwargs",
    [{"base": -1.0}, {"base": float("nan")}, {"cap": -1.0}, {"max_attempts": 0}],
    ids=str,
)
def test_an_invalid_backoff_is_refused_at_definition(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_a_zero_base_gives_immediate_retries() -> None:
    assert Backoff(base=0.0).delay(3) == 0.0


def test_forked_children_draw_different_delays() -> None:
    """A prefork pool forks after import: each child must jitter on its own, or the retries
    of jobs that failed together come back together."""
    reads = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one draw, written back, then out without cleanup
            os.write(write, repr(BACKOFF.delay(5)).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            reads.append(float(pipe.read()))
    assert reads[0] != reads[1]
