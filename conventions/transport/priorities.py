"""The order in which a fetch looks at a queue's priority lists: weighted, never strict.

kombu keeps one Redis list per priority step (``<queue>\\x06\\x16<step>``, step 0 the
highest). A strict fetch reads step 0 first every time, so a sustained flood of
high-priority jobs starves the others for as long as it lasts. Here each consumer turns
through a fixed cycle of :func:`weights` (4:2:1 for three steps): on most fetches it looks
at the highest step first, but on some it looks at a lower one first, and it falls
through to the others when that list is empty, so no fetch is wasted.

The bound: with ``n`` steps the cycle is ``2**n - 1`` fetches long and step ``i`` comes
first ``2**(n - 1 - i)`` times in it, spread out (smooth weighted round robin), so the
lowest step comes first once in every ``2**n - 1`` consecutive fetches of a consumer.
Under any flood of higher steps, the ``k``-th job waiting at the lowest step is fetched
within ``k * (2**n - 1)`` fetches of one consumer (7k for three steps); with ``N``
consumers of ``c`` slots and jobs of ``T`` seconds, that is within about
``k * (2**n - 1) * T / (N * c)`` seconds. One step (the reliable profile's
``priority_steps = [0]``) keeps the plain order.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache


def weights(count: int) -> tuple[int, ...]:
    """Each step's share of first looks, highest first: 1 for one step; 4, 2, 1 for
    three: each step is looked at first twice as often as the next lower one."""
    return tuple(2 ** (count - 1 - i) for i in range(count))


@cache
def cycle(count: int) -> tuple[int, ...]:
    """The index of the step looked at first on each fetch of one cycle (smooth weighted
    round robin: the shares are spread out, the highest step first)."""
    shares = weights(count)
    total = sum(shares)
    current = [0] * count
    out: list[int] = []
    for _ in range(total):
        current = [c + s for c, s in zip(current, shares, strict=True)]
        pick = max(range(count), key=lambda i: (current[i], -i))
        current[pick] -= total
        out.append(pick)
    return tuple(out)


def fetch_order(steps: Sequence[int], turn: int) -> list[int]:
    """``steps`` in the order fetch number ``turn`` looks at them: its cycle's first
    step, then the others from the highest."""
    ordered = sorted(steps)
    if len(ordered) < 2:
        return ordered
    plan = cycle(len(ordered))
    first = ordered[plan[turn % len(plan)]]
    return [first, *(step for step in ordered if step != first)]
