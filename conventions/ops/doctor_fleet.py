"""The doctor's fleet check on the layer's Redis transport: do the live consumers of one
Redis agree on ``recovery_timeout``?

Each consumer's keeper (:mod:`conventions.transport.liveness`) renews its score in
``_cc.consumers`` to the Redis clock plus *its own* ``recovery_timeout``, and every
consumer takes the others for dead by those scores and gives back the unacked messages
whose score is older than *its own* ``recovery_timeout``. A fleet that disagrees gives
jobs back too early (a long-timeout worker's running jobs taken by a short-timeout
sweeper: run twice) or too late (a dead worker's jobs wait for the longest bound).

The transport does not write the setting itself; it is read back from what the beat
writes. A beat sets the score to ``beat + recovery_timeout`` (the ``beat`` field of the
consumer's description, Redis clock), and the sign of life sent before a fetch only
raises it (``now + recovery_timeout``, at most now). So, read together with the Redis
clock:

    score - now  <=  recovery_timeout  <=  score - beat

an interval as wide as the time since the last beat (at most a third of the bound). The
doctor says the fleet disagrees only when these intervals exclude each other, or exclude
this app's setting: never on a guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kombu.utils.encoding import bytes_to_str

from conventions.ops.doctor_time import recovery_timeout
from conventions.ops.findings import WARNING, Finding
from conventions.transport import layout

#: the finding's code
CODE = "recovery-timeout-disagrees"
#: seconds of slack on each bound (the clock's read and the scores' six decimals)
SLACK = 0.05
#: workers named in the finding at most (those that disagree with this app first)
NAMED = 10


@dataclass(frozen=True)
class Bound:
    """One live consumer's ``recovery_timeout`` as read back from its score: between
    ``low`` and ``high`` seconds."""

    consumer: str
    host: str
    pid: str
    low: float
    high: float

    @property
    def worker(self) -> str:
        return f"{self.host}:{self.pid}" if self.host else self.consumer

    def admits(self, value: float) -> bool:
        return self.low - SLACK <= value <= self.high + SLACK

    def overlaps(self, other: Bound) -> bool:
        return self.low - SLACK <= other.high + SLACK and other.low - SLACK <= self.high + SLACK

    def shown(self) -> str:
        if self.high - self.low < 1:
            return f"{(self.low + self.high) / 2:g}s".replace(".0s", "s")
        return f"{self.low:.0f}-{self.high:.0f}s"


def read_bounds(client: Any) -> list[Bound]:
    """The live consumers' ``recovery_timeout`` bounds: three commands and one per
    consumer (pipelined). A consumer without a ``beat`` in its description (an older
    layer) is left out."""
    now = layout.server_now(client)
    alive = client.zrangebyscore(layout.CONSUMERS, now, "+inf", withscores=True)
    if not alive:
        return []
    pipe = client.pipeline(transaction=False)
    for consumer, _ in alive:
        pipe.hmget(layout.CONSUMER.format(consumer=bytes_to_str(consumer)), "beat", "host", "pid")
    bounds = []
    for (consumer, score), (beat, host, pid) in zip(alive, pipe.execute(), strict=True):
        try:
            stamp = float(bytes_to_str(beat))
        except (TypeError, ValueError):
            continue
        high, low = float(score) - stamp, float(score) - now
        bounds.append(Bound(bytes_to_str(consumer), bytes_to_str(host or b""),
                            bytes_to_str(pid or b""), max(low, 0.0), high))  # fmt: skip
    return sorted(bounds, key=lambda b: (b.high, b.worker))


def fleet_findings(conf: Any, bounds: list[Bound], where: str = "redis") -> Iterator[Finding]:
    """One warning when the live consumers disagree with each other or with ``conf``'s
    ``recovery_timeout``, naming each worker and its value."""
    if not bounds:
        return
    own = recovery_timeout(conf)
    apart = [b for b in bounds if not b.admits(own)]
    split = any(not a.overlaps(b) for a in bounds for b in bounds)
    if not apart and not split:
        return
    named = sorted(bounds, key=lambda b: b.admits(own))[:NAMED]  # the odd ones first
    shown = ", ".join(f"{b.worker} {b.shown()}" for b in named)
    if len(bounds) > len(named):
        shown += f" and {len(bounds) - len(named)} more"
    yield Finding(
        WARNING, CODE, f"{where} consumers",
        f"the live consumers do not agree on broker_transport_options['recovery_timeout'] "
        f"(this app: {own:g}s; {shown}): a consumer takes another for dead, and gives back "
        "its unacked jobs, by its own setting, so a short one runs a long one's jobs twice "
        "and a long one leaves a dead worker's jobs waiting; give every worker of this "
        "Redis the same recovery_timeout and restart the odd ones",
    )  # fmt: skip
