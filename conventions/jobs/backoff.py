"""How long to wait before the next attempt: capped exponential backoff, with jitter.

Jitter (a uniform draw below the exponential ceiling, as in the AWS architecture blog's
"Exponential Backoff and Jitter") spreads the retries of many jobs that failed together,
instead of sending them back in synchronised waves. The default draws each delay from
the upper half of its ceiling ("equal jitter"): spread enough, and a floor under the
whole budget. With full jitter a job's retries can all draw short delays and be spent
within seconds, which is how a 30 s outage used to dead-letter jobs as ``exhausted``.

The default budget (``Backoff().budget()``): 15 attempts, 14 waits from 1-2 s doubling
up to 5 minutes, between 19.3 and 38.5 minutes in all (29 expected) before the last
attempt. Long enough to outlast a deploy or an ordinary outage of a database or a
provider; short enough that a person hears about a real one the same hour.

A ``Backoff`` is a frozen value and every delay is computed per attempt from its
arguments alone. Nothing shared is mutated: Celery's ``autoretry_for`` keeps its retry
kwargs in state shared by every call of a task (celery/celery#10456), which is what
this module exists to avoid.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from typing import NamedTuple

from conventions.errors import ConfigurationError

#: ``2 ** 1023`` is the largest power of two a float holds; past it, the cap applies anyway
_MAX_EXPONENT = 1023


class Budget(NamedTuple):
    """How long a job may wait in all between its first and its last attempt (seconds,
    run time not included): ``retries`` waits, each jittered between its bounds."""

    retries: int
    shortest: float
    expected: float
    longest: float


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter.

    ``base`` is the ceiling of the first retry's delay (seconds), doubled on each
    further attempt up to ``cap``. ``jitter`` is the random share of each delay: the
    delay is uniform in ``[ceiling * (1 - jitter), ceiling]``, so 0.5 (the default)
    keeps at least half of every ceiling, 1.0 is full jitter (from 0) and 0 none.
    ``max_attempts`` is how many attempts a job gets in all, the first run included; the
    worker enforces it (this class only computes delays) and dead-letters the job as
    ``exhausted`` after the last one.
    """

    base: float = 2.0
    cap: float = 300.0
    max_attempts: int = 15
    jitter: float = 0.5

    def __post_init__(self) -> None:
        # 0 is allowed for both (immediate retries, e.g. in tests); NaN and negatives are not
        if not (math.isfinite(self.base) and self.base >= 0):
            raise ConfigurationError(f"Backoff(base={self.base!r}): base must be >= 0 seconds")
        if not self.cap >= 0:
            raise ConfigurationError(f"Backoff(cap={self.cap!r}): cap must be >= 0 seconds")
        if self.max_attempts < 1:
            raise ConfigurationError(
                f"Backoff(max_attempts={self.max_attempts!r}): a job needs at least 1 attempt"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError(
                f"Backoff(jitter={self.jitter!r}): jitter is the random share of each "
                "delay, from 0 (none) to 1 (full jitter)"
            )

    def ceiling(self, attempt: int) -> float:
        """The largest delay of retry number ``attempt``: ``min(cap, base * 2**(attempt-1))``."""
        if attempt < 1:
            raise ValueError(f"attempt counts from 1 (the first retry), got {attempt}")
        return min(self.cap, self.base * 2.0 ** min(attempt - 1, _MAX_EXPONENT))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The jittered delay before retry number ``attempt`` (1 = the first retry):
        uniform in ``[ceiling * (1 - jitter), ceiling]``. Pass a seeded ``rng`` for
        reproducibility."""
        ceiling = self.ceiling(attempt)
        return (rng or _RANDOM).uniform(ceiling * (1.0 - self.jitter), ceiling)

    def budget(self, limit: float | None = None) -> Budget:
        """The shortest, expected and longest total wait over every retry a job gets,
        each delay clamped to ``limit`` (the broker's safe maximum) when given."""
        retries = self.max_attempts - 1
        shortest = expected = longest = 0.0
        for attempt in range(1, retries + 1):
            high = self.ceiling(attempt)
            low = high * (1.0 - self.jitter)
            bound = math.inf if limit is None else limit
            shortest += min(low, bound)
            longest += min(high, bound)
            expected += _clamped_mean(low, high, bound)
        return Budget(retries, shortest, expected, longest)

    def countdown(
        self,
        attempt: int,
        requested: float | None,
        limit: float,
        rng: random.Random | None = None,
    ) -> float:
        """The countdown to publish retry number ``attempt`` with, in seconds.

        ``requested`` is a delay the failure asked for (a ``Retry-After`` header, a
        ``TransientError.retry_after``): the countdown is never shorter than it, and the
        jittered backoff still applies when that is longer. The result is then CLAMPED
        to ``limit``, the broker's safe maximum (on Redis, the visibility timeout minus a
        margin: a longer ETA is redelivered early, possibly twice). A requested delay
        beyond ``limit`` is therefore shortened; the job comes back early and, if still
        throttled, asks again.
        """
        if not limit > 0:
            raise ValueError(f"limit must be > 0 seconds, got {limit!r}")
        wait = self.delay(attempt, rng)
        if requested is not None and not math.isnan(requested):
            wait = max(wait, float(requested))
        return min(wait, limit)


def _clamped_mean(low: float, high: float, bound: float) -> float:
    """The mean of ``min(uniform(low, high), bound)``."""
    if bound >= high:
        return (low + high) / 2
    if bound <= low:
        return bound
    below = (bound * bound - low * low) / 2  # the draws under the bound, integrated
    return (below + bound * (high - bound)) / (high - low)


# A private generator, not the ``random`` module's global one: drawing delays never
# disturbs (or depends on) a seed the application set for its own purposes. Reseeded in
# every forked child, as ``random`` does for its own: Celery's prefork pool forks after
# import, and children sharing one state would draw the same "jittered" delays.
_RANDOM = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RANDOM.seed)
