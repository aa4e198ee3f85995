"""Priority levels on the layer's Redis transport: the flood, and what the levels cost.

No Celery: one kombu consumer on ``conventions.transport.redis`` (prefetch 1, acking each
message), as in :mod:`bench.transport`.

- **flood**: a backlog of ``high`` jobs with a few ``normal`` and ``low`` ones published
  behind it, drained by one consumer. Per level: how many, the median and p99 wait (from
  the drain's start to the delivery), and the worst place of the ``k``-th ``low`` job
  against its bound, ``7k`` (``conventions.transport.priorities``).
- **cost**: the drain rate of jobs all at one level with ``priority_steps = [0, 3, 6]``
  against ``[0]`` (one list), interleaved: what the weighted sweep over three lists costs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

from bench import common
from bench.report import Report, Row
from conventions.jobs import priority

TRANSPORT = "conventions.transport.redis:Transport"
QUEUE = Queue("bench_priorities", Exchange("bench_priorities", type="direct"),
              routing_key="bench_priorities")  # fmt: skip
BODY = {"order_id": "ord_000001", "pad": "x" * 600}
#: the weighted cycle's length for three steps (the lowest is first once in it)
CYCLE = 7


def _drain(steps: list[int], plan: list[str]) -> list[tuple[str, float]]:
    """Publish one message per entry of ``plan`` (its level), then drain them all with one
    consumer: each delivery's level and seconds since the drain started, in order."""
    options = {"priority_steps": steps, "recovery_timeout": 30}
    with Connection(common.url(), transport=TRANSPORT, transport_options=options) as conn:
        channel = conn.default_channel
        channel.client.delete(*(f"{QUEUE.name}\x06\x16{s}" if s else QUEUE.name for s in steps))
        producer = Producer(channel)
        for level in plan:
            producer.publish({**BODY, "level": level}, exchange=QUEUE.exchange,
                             routing_key=QUEUE.routing_key, declare=[QUEUE],
                             priority=priority.REDIS_STEPS[level])  # fmt: skip
        got: list[tuple[str, float]] = []
        started = time.perf_counter()

        def on_message(body: Any, message: Any) -> None:
            got.append((body["level"], time.perf_counter() - started))
            message.ack()

        with Consumer(conn, [QUEUE], callbacks=[on_message], prefetch_count=1):
            while len(got) < len(plan):
                conn.drain_events(timeout=5)
        return got


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def flood(report: Report, *, n: int) -> None:
    lows = max(3, n // 200)
    plan = ["high"] * n + ["normal"] * lows + ["low"] * lows
    got = _drain(priority.STEPS, plan)
    for level in priority.LEVELS:
        waits = [seconds * 1000 for lv, seconds in got if lv == level]
        note = f"{len(waits)} jobs, p99 {_quantile(waits, 0.99):.1f} ms, max {max(waits):.1f} ms"
        report.add(Row("priorities", f"flood: {level} jobs' median wait", statistics.median(waits),
                       "ms", "", note))  # fmt: skip
    places = [place for place, (lv, _) in enumerate(got, 1) if lv == "low"]
    worst = max(place / (k * CYCLE) for k, place in enumerate(places, 1))
    note = f"the k-th low job's delivery over 7k, worst of {lows}; {n} high jobs queued"
    report.add(Row("priorities", "flood: low jobs' place against their bound", worst, "x",
                   "<= 1", note))  # fmt: skip


def section(report: Report, client: Any, *, n: int, rounds: int) -> None:
    flood(report, n=n)

    def rate(steps: list[int]) -> float:
        got = _drain(steps, ["normal"] * n)
        return n / got[-1][1]

    rates = common.interleave(
        {"levels": lambda: rate(priority.STEPS), "one": lambda: rate([0])}, rounds
    )
    ratio = statistics.median(common.ratios(rates["levels"], rates["one"]))
    note = (
        f"three steps {statistics.median(rates['levels']):,.0f} msg/s, one "
        f"{statistics.median(rates['one']):,.0f} msg/s; {n} messages, {rounds} rounds"
    )
    report.add(Row("priorities", "drain with three priority steps vs one (rate ratio)", ratio,
                   "x", "", note))  # fmt: skip
    client.flushdb()
