"""The token bucket both stores keep per dependency, as one pure step.

A bucket is three instants (POSIX seconds): ``tat``, when the next place in line is due
(the schedule of booked tokens), ``use``, when the next token may be used (the tokens
actually taken), and ``paused``, before which no token is used at all (a 429's
Retry-After). It is a GCRA (a token bucket kept as times, not counts): one token every
``interval`` seconds, and up to ``burst`` at once when the bucket has been idle.

Two registers instead of one, so that a backlog neither stampedes nor bunches: a job
that finds no token books a place in line (``tat`` moves on) and is deferred to it, so
waiting jobs ask once instead of polling; when it comes back it takes a token only if
``use`` allows it, so jobs that come back late (ETA timers, a busy pool) never use
their tokens closer together than ``interval``. The Redis store runs the same step in
Lua (``conventions.store.redis_coordination``); the SQL store calls :func:`step` under a
row lock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """One bucket's three instants; a missing bucket is ``Bucket(0, 0, 0)``."""

    tat: float = 0.0
    use: float = 0.0
    paused: float = 0.0


def step(
    bucket: Bucket, now: float, interval: float, burst: int, *, max_wait: float, booked: bool
) -> tuple[Bucket, float]:
    """Take a token now, or say how long to wait: ``(new bucket, wait seconds)``.

    ``wait`` is 0 when a token was taken. A caller that has not ``booked`` yet books a
    place in line when the wait is at most ``max_wait`` (``tat`` moves on); beyond it
    nothing changes. A ``booked`` caller only checks ``use`` and ``paused``.
    """
    slack = (max(burst, 1) - 1) * interval
    tat, use = max(bucket.tat, now), max(bucket.use, now)
    free_at = max(use - slack, bucket.paused)
    if booked:
        wait = free_at - now
    else:
        sched = max(tat, bucket.paused)
        wait = max(sched - slack, free_at) - now
        if wait > max_wait:
            return bucket, wait
        tat = sched + interval
    if wait <= 0:
        return Bucket(tat, use + interval, bucket.paused), 0.0
    return Bucket(tat, bucket.use, bucket.paused), wait


def pause(bucket: Bucket, until: float) -> Bucket:
    """No token is used before ``until``; a pause is only ever extended."""
    return Bucket(bucket.tat, bucket.use, max(bucket.paused, until))
