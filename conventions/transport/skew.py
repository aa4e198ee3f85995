"""How far this process' clock is from the Redis server's, and how far is too far.

Every lease, in-flight score and due time of the layer's transport is compared on the
Redis server's clock (``TIME`` inside the scripts), so a worker's skew cannot deliver a
running job twice nor run a delayed one early. A process' own clock is still read where
Celery and the layer write *times* rather than compare them: the ``eta`` a publisher
writes (a countdown is its ``now`` plus the delay), the moments beat fires (its business
dates), an ``expires`` the worker checks, the timestamps of the run history and audit
trail. A skewed clock shifts those by its skew, so it is measured:

* at start, by the doctor (every worker runs it, and beat runs this check):
  :data:`WARN_AT` and beyond is a warning, :data:`REFUSE_AT` and beyond an error that
  refuses the start;
* while a worker runs, by its keeper at every beat: a warning in the log beyond
  :data:`WARN_AT` (repeated every :data:`WARN_EVERY` while it lasts), and the skew in the
  consumer's description (``_cc.consumer.<id>``, field ``skew``), which the exporter
  shows as ``celery_conventions_clock_skew_seconds``.

Why 2 s and 5 s: NTP keeps a synced machine within milliseconds, so 2 s means its time
sync is broken or not yet done (a container started before it synced, a VM resumed);
within 5 s a skewed publisher's countdowns and a skewed beat's firings are off by less
than the keeper's shortest renewal period (a third of the smallest ``recovery_timeout``
the doctor accepts, 5 s), which is the tolerance the rest of the timing already has.

The skew is this clock minus Redis' (positive: this machine runs ahead), measured as
the midpoint of the round trip of a ``TIME``; a round trip longer than
:data:`MAX_ROUND_TRIP` is not trusted (its error could exceed the bound).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic, time
from typing import Any

logger = logging.getLogger("conventions.transport.skew")

#: seconds of skew from which the doctor and the keeper warn
WARN_AT = 2.0
#: seconds of skew from which the doctor refuses to start a worker or beat
REFUSE_AT = 5.0
#: a measurement whose round trip took longer than this (seconds) is not used
MAX_ROUND_TRIP = 0.5
#: seconds between two warnings of the keeper while the skew stays beyond the bound
WARN_EVERY = 300.0


def between(sent: float, received: float, server: float) -> float | None:
    """The skew from one round trip: sent and received on this clock, ``server`` the
    Redis clock in its reply; None when the round trip was too long to tell."""
    if received - sent > MAX_ROUND_TRIP or received < sent:
        return None
    return (sent + received) / 2 - server


def measure(client: Any, clock: Callable[[], float] = time) -> float | None:
    """This process' clock minus the Redis server's (seconds), or None (see
    :func:`between`); ``client`` is a redis-py client."""
    sent = clock()
    seconds, micros = client.time()
    return between(sent, clock(), float(seconds) + float(micros) / 1_000_000)


class Watch:
    """The keeper's running comparison: the last skew measured, and a warning in the
    log when it is beyond :data:`WARN_AT` (again every :data:`WARN_EVERY` while it lasts,
    and a line when it is back within)."""

    def __init__(self, who: str) -> None:
        self.who = who
        #: the last skew measured (seconds), None before the first
        self.skew: float | None = None
        self._warned_at: float | None = None

    def observe(self, sent: float, received: float, server: float) -> float | None:
        found = between(sent, received, server)
        if found is None:
            return self.skew
        self.skew = found
        now = monotonic()
        if abs(found) >= WARN_AT:
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY:
                self._warned_at = now
                logger.warning(
                    "%s: this machine's clock is %+.1fs from the Redis server's (bound "
                    "%.0fs): leases and due times still follow Redis, but this process' "
                    "timestamps, countdowns and expiries are off by that much; fix its time "
                    "sync (NTP)", self.who, found, WARN_AT,
                )  # fmt: skip
        elif self._warned_at is not None:
            self._warned_at = None
            logger.info("%s: clock back within %.0fs of Redis' (%+.2fs)", self.who, WARN_AT, found)
        return self.skew
