"""An idle consumer of several queues wakes on the bell of the queue a job lands in.

The fetch of a consumer reading several lists sweeps them all, and when all are empty
waits on their queues' bells (``BLPOP``), which every publish of the layer rings with its
push. The signal checked is the wake-up itself, never a duration: the channel counts the
messages taken by a sweep that a bell started (``taken_on_ring``), and ``MONITOR`` shows
the consumer waiting on the bells with the back-off at its longest before the publish.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from conventions.transport import liveness
from conventions.transport import redis as broker
from conventions.transport.layout import CONSUMERS
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.helpers import Monitor, wait_for
from tests.integration.support_jobs import probe

URL = f"{REDIS_BASE}/{BROKER_DB}"
OPTIONS = {"priority_steps": [0], "fetch_wait": 0.05, "fetch_wait_max": 0.4}
#: publishes tried until one lands while the consumer waits on the bells: on a loaded
#: machine the wait may run out first, and the timed sweep takes the job (the fallback)
ATTEMPTS = 5


def waiting_at_longest(monitor: Monitor, bell: str, longest: str) -> bool:
    """Whether the consumer sent a wait on ``bell`` with the back-off at its longest."""
    return any(line["command"].startswith("BLPOP") and bell in line["command"]
               and line["command"].endswith(f" {longest}")
               for line in list(monitor.lines))  # fmt: skip


def test_an_idle_worker_on_two_queues_takes_a_job_on_its_second_queue_on_the_bells_wake_up(
    thread_worker: Any,
) -> None:
    channel = thread_worker.consumer.task_consumer.channel
    taken = channel.taken_on_ring
    for attempt in range(ATTEMPTS):
        with Monitor() as monitor:
            # idle past the back-off's longest wait (fetch_wait_max, capped by the block)
            wait_for(lambda: waiting_at_longest(monitor, broker.bell_of("heavy"),
                                                repr(channel.idle_block)))  # fmt: skip
            result = probe.delay(call_id=f"bell-{uuid.uuid4().hex[:8]}-{attempt}")
            assert result.get(timeout=30)
        if channel.taken_on_ring > taken:
            break
    assert channel.taken_on_ring == taken + 1


@pytest.fixture
def queues() -> list[Queue]:
    name = f"bell-test-{uuid.uuid4().hex[:8]}"
    return [Queue(n, Exchange(n, type="direct"), routing_key=n) for n in (name, f"{name}-b")]


@contextlib.contextmanager
def idle_consumer(queues: list[Queue], got: list[Any]) -> Iterator[Any]:
    """A consumer of ``queues`` draining in the caller's thread: yields a ``drain()``."""
    with (
        Connection(URL, transport=broker.Transport, transport_options=OPTIONS) as connection,
        Consumer(connection, queues, prefetch_count=1,
                 on_message=lambda m: (got.append(m.decode()), m.ack())),
    ):  # fmt: skip

        def drain() -> Any:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.2)
            return connection.default_channel

        yield drain


def test_a_plain_kombu_publish_rings_the_bell_of_its_queue(
    services: None, queues: list[Queue]
) -> None:
    got: list[Any] = []
    with idle_consumer(queues, got) as drain:
        channel = drain()
        for n in range(ATTEMPTS):
            with Monitor() as monitor:
                wait_for(lambda: drain() and waiting_at_longest(
                    monitor, broker.bell_of(queues[1].name), "0.4"), every=0)  # fmt: skip
                publish(queues[1], {"n": n})
                wait_for(lambda: drain() and len(got) > n, every=0)  # noqa: B023
            if channel.taken_on_ring:
                break
    assert channel.taken_on_ring == 1


def test_a_due_delayed_message_rings_the_bell_of_its_queue(
    services: None, queues: list[Queue]
) -> None:
    got: list[Any] = []
    with idle_consumer(queues, got) as drain:
        channel = drain()
        for n in range(ATTEMPTS):
            eta = datetime.now(UTC) + timedelta(seconds=1.5)
            publish(queues[1], {"n": n}, headers={"eta": eta.isoformat()})
            wait_for(lambda: drain() and len(got) > n, every=0)  # noqa: B023
            if channel.taken_on_ring:
                break
    assert channel.taken_on_ring == 1


def publish(queue: Queue, body: Any, **kwargs: Any) -> None:
    with Connection(URL, transport=broker.Transport, transport_options=OPTIONS) as pub:
        Producer(pub.default_channel).publish(
            body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue],
            **kwargs,
        )  # fmt: skip


def test_a_job_given_back_from_a_dead_consumers_inbox_rings_the_bell_of_its_queue(
    services: None, broker_redis: redis.Redis, queues: list[Queue]
) -> None:
    """The sweep that gives back a dead consumer's inbox rings its queue's bell: an idle
    consumer of several queues takes the job at once, not at its next timed sweep."""
    got: list[Any] = []
    staging = Queue(f"{queues[0].name}-staging", Exchange("", type="direct"),
                    routing_key=f"{queues[0].name}-staging")  # fmt: skip
    with idle_consumer(queues, got) as drain:
        channel = drain()
        for n in range(ATTEMPTS):
            dead = uuid.uuid4().hex  # killed right after its fetch: the job in its inbox
            inbox = broker.INBOX.format(consumer=dead, source=queues[1].name)
            with Connection(URL, transport="redis", transport_options=OPTIONS) as pub:
                Producer(pub.default_channel).publish(
                    {"n": n}, exchange=staging.exchange, routing_key=staging.routing_key,
                    declare=[staging],
                )  # fmt: skip
            broker_redis.hset(broker.INBOXES, inbox, queues[1].name)
            broker_redis.lmove(staging.name, inbox, "RIGHT", "LEFT")
            broker_redis.zadd(CONSUMERS, {dead: 1})  # its sign of life long lapsed
            with Monitor() as monitor:
                wait_for(lambda: drain() and waiting_at_longest(
                    monitor, broker.bell_of(queues[1].name), "0.4"), every=0)  # fmt: skip
                given = liveness.give_back_dead(broker_redis, "a-sweeper", grace=30)
                # the idle consumer's own keeper sweeps too: one of the two gave it back
                # (a give-back that moved a message keeps the consumer registered: it is
                # forgotten only once its inboxes stayed empty for the grace)
                assert given == 1 or broker_redis.llen(inbox) == 0, given
                wait_for(lambda: drain() and len(got) > n, every=0)  # noqa: B023
            if channel.taken_on_ring:
                break
    assert channel.taken_on_ring == 1
    assert got[-1] == {"n": n}


def test_a_foreign_lpush_without_a_bell_is_still_taken_by_the_next_sweep(
    services: None, broker_redis: redis.Redis, queues: list[Queue]
) -> None:
    got: list[Any] = []
    with idle_consumer(queues, got) as drain:
        channel = drain()
        deadline = time.monotonic() + 1  # some idle rounds, the back-off grown
        while time.monotonic() < deadline:
            drain()
        with Connection(URL, transport="redis", transport_options=OPTIONS) as pub:
            Producer(pub.default_channel).publish(
                {"n": 2}, exchange=queues[1].exchange, routing_key=queues[1].routing_key,
                declare=[queues[1]],
            )  # fmt: skip
        assert not broker_redis.exists(broker.bell_of(queues[1].name))
        wait_for(lambda: drain() and got, every=0)
    assert got == [{"n": 2}]
    assert channel.taken_on_ring == 0
