"""How long to wait before the next attempt: capped exponential backoff, full jitter.

Full jitter (a uniform draw between 0 and the exponential ceiling, as in the AWS
architecture blog's "Exponential Backoff and Jitter") spreads the retries of many jobs
that failed together, instead of sending them back in synchronised waves.

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

from conventions.errors import ConfigurationError

#: ``2 ** 1023`` is the largest power of two a float holds; past it, the cap applies anyway
_MAX_EXPONENT = 1023


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter.

    ``base`` is the ceiling of the first retry's delay (seconds), doubled on each
    further attempt up to ``cap``. ``max_attempts`` is how many attempts a job gets in
    all, the first run included; the worker enforces it (this class only computes
    delays) and dead-letters the job as ``exhausted`` after the last one.
    """

    base: float = 1.0
    cap: float = 600.0
    max_attempts: int = 5

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

    def ceiling(self, attempt: int) -> float:
        """The largest delay of retry number ``attempt``: ``min(cap, base * 2**(attempt-1))``."""
        if attempt < 1:
            raise ValueError(f"attempt counts from 1 (the first retry), got {attempt}")
        return min(self.cap, self.base * 2.0 ** min(attempt - 1, _MAX_EXPONENT))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The jittered delay before retry number ``attempt`` (1 = the first retry):
        uniform in ``[0, ceiling(attempt)]``. Pass a seeded ``rng`` for reproducibility."""
        return (rng or _RANDOM).uniform(0.0, self.ceiling(attempt))

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


# A private generator, not the ``random`` module's global one: drawing delays never
# disturbs (or depends on) a seed the application set for its own purposes. Reseeded in
# every forked child, as ``random`` does for its own: Celery's prefork pool forks after
# import, and children sharing one state would draw the same "jittered" delays.
_RANDOM = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RANDOM.seed)
