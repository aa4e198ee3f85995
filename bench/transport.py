"""The fetch alone: ``conventions.transport.redis`` against kombu's Redis transport.

No Celery, no layer: one kombu consumer (prefetch 1, acking each message) drains ``n``
messages from one queue, once per transport per round, interleaved. What differs is
only how a message is fetched and recorded as unacked: ``BRPOP`` then a pipeline
(kombu), or ``BLMOVE`` into the consumer's inbox then one Lua claim (ours). Both make
two round trips per message; this checks that the inbox costs nothing measurable.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

from bench import common
from bench.report import Report, Row

#: the transports compared, by their kombu names
TRANSPORTS = {"inbox": "conventions.transport.redis:Transport", "kombu": "redis"}
QUEUE = Queue("bench_transport", Exchange("bench_transport", type="direct"),
              routing_key="bench_transport")  # fmt: skip
#: a message the size of a layer job's (an id-only payload and the layer's headers)
BODY = {"order_id": "ord_000001", "pad": "x" * 600}


def drain_rate(transport: str, n: int) -> float:
    """Messages per second one consumer fetches and acks on ``transport``."""
    options = {"priority_steps": [0], "visibility_timeout": 3600}
    with Connection(common.url(), transport=transport, transport_options=options) as conn:
        channel = conn.default_channel
        channel.client.delete(QUEUE.name)
        producer = Producer(channel)
        producer.publish(BODY, exchange=QUEUE.exchange, routing_key=QUEUE.routing_key,
                         declare=[QUEUE])  # fmt: skip
        for _ in range(n - 1):
            producer.publish(BODY, exchange=QUEUE.exchange, routing_key=QUEUE.routing_key)
        done = [0]

        def on_message(message: Any) -> None:
            done[0] += 1
            message.ack()

        with Consumer(conn, [QUEUE], on_message=on_message, prefetch_count=1):
            started = time.perf_counter()
            while done[0] < n:
                conn.drain_events(timeout=5)
            return n / (time.perf_counter() - started)


def section(report: Report, client: Any, *, n: int, rounds: int) -> None:
    measure = {
        name: (lambda t=transport: drain_rate(t, n)) for name, transport in TRANSPORTS.items()
    }
    rates = common.interleave(measure, rounds)
    ratio = statistics.median(common.ratios(rates["inbox"], rates["kombu"]))
    note = (
        f"inbox {statistics.median(rates['inbox']):,.0f} msg/s, kombu "
        f"{statistics.median(rates['kombu']):,.0f} msg/s; {n} messages, {rounds} rounds"
    )
    report.add(Row("transport", "fetch + ack, inbox vs kombu's BRPOP (rate ratio)", ratio, "x",
                   ">= 0.95", note))  # fmt: skip
    client.flushdb()
