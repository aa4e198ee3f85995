"""Backoff: capped exponential ceilings, jitter, requested delays, broker clamp, budget."""

from __future__ import annotations

import os
import random
from dataclasses import FrozenInstanceError
from statistics import mean

import pytest

from conventions.config.settings import (
    CELERY_REDIS_VISIBILITY,
    COUNTDOWN_MARGIN,
    DEFAULT_MAX_COUNTDOWN,
)
from conventions.errors import ConfigurationError
from conventions.jobs.backoff import Backoff

BACKOFF = Backoff(base=2.0, cap=60.0, max_attempts=8, jitter=1.0)


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


def test_defaults_are_two_seconds_five_minutes_fifteen_attempts_half_jittered() -> None:
    assert Backoff() == Backoff(base=2.0, cap=300.0, max_attempts=15, jitter=0.5)


def test_the_default_budget_outlasts_an_ordinary_outage_or_deploy() -> None:
    """Sidekiq retries for about 21 days, Oban 20 times: ours gives a transient error
    between about 19 and 39 minutes of waiting before the job is dead-lettered as
    ``exhausted`` (the figures the retries how-to states)."""
    budget = Backoff().budget()
    assert budget.retries == 14
    assert budget.shortest == pytest.approx(1155.0)  # 19 min 15 s: never less
    assert budget.expected == pytest.approx(1732.5)  # about 29 min
    assert budget.longest == pytest.approx(2310.0)  # 38 min 30 s
    assert Backoff().ceiling(9) == 300.0  # from the 9th retry on, 5 minutes apart


def test_every_default_countdown_stays_below_the_brokers_safe_maximum() -> None:
    for limit in (DEFAULT_MAX_COUNTDOWN, CELERY_REDIS_VISIBILITY - COUNTDOWN_MARGIN):
        assert Backoff().cap < limit
        assert Backoff().budget(limit) == Backoff().budget()


def test_the_budget_counts_the_clamp_to_the_brokers_limit() -> None:
    budget = Backoff(base=10.0, cap=1000.0, max_attempts=4, jitter=1.0).budget(limit=25.0)
    assert (budget.shortest, budget.longest) == (0.0, 10.0 + 20.0 + 25.0)
    # the third delay is uniform in [0, 40] then clamped: 25 for 15/40 of the draws
    assert budget.expected == pytest.approx(5.0 + 10.0 + (25.0**2 / 2 + 25.0 * 15.0) / 40.0)


def test_a_single_attempt_has_no_budget() -> None:
    assert Backoff(max_attempts=1).budget() == (0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("attempt", range(1, 16))
def test_a_half_jittered_delay_never_falls_below_half_its_ceiling(attempt: int) -> None:
    backoff = Backoff()
    ceiling = backoff.ceiling(attempt)
    assert all(ceiling / 2 <= d <= ceiling for d in draws(backoff, attempt))


def test_full_jitter_and_no_jitter_are_the_ends_of_the_range() -> None:
    full = Backoff(base=8.0, cap=8.0, jitter=1.0)
    assert min(draws(full, 1, n=500)) < 1.0
    assert set(draws(Backoff(base=8.0, cap=8.0, jitter=0.0), 1, n=20)) == {8.0}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1.0},
        {"base": float("nan")},
        {"cap": -1.0},
        {"max_attempts": 0},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"jitter": float("nan")},
    ],
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
