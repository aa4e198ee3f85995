"""The mover of a queue's turn sleeps until its next due member, and a push wakes it.

An idle consumer's keeper holds its queues' turns and waits (one ``BLPOP`` on their mover
bells) until the next member of their delayed sets falls due, at most
``mover_interval``; every push into a delayed set rings the queue's mover bell and cuts a
longer turn down to the new member's due time plus the slack. So a countdown published
while the mover sleeps is still moved when due, and a holder that died while asleep
does not keep the queue's due jobs from another consumer past the documented bound.

Here ``mover_interval`` is made far longer than the waits the test allows, so that a
mover that only woke at its timed look (the former design) would fail it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from kombu import Connection, Exchange, Queue

from conventions.config.profile import INBOX_TRANSPORT
from conventions.transport import delayed
from conventions.transport.layout import MOVER
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.integration.test_broker import consume
from tests.integration.test_delayed import publish_at

pytestmark = [pytest.mark.usefixtures("services"), pytest.mark.timeout(90)]

URL = f"{REDIS_BASE}/{BROKER_DB}"
#: the holder's timed look is 60 s away: only a push's bell can wake it sooner
ASLEEP = {"priority_steps": [0], "recovery_timeout": 30, "mover_interval": 60}
#: a consumer that looks for a free turn every 0.5 s (recovery_timeout / 6)
LOOKING = {"priority_steps": [0], "recovery_timeout": 3, "mover_interval": 0.1}


@pytest.fixture
def queue() -> Queue:
    name = f"sleep-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    with redis.Redis.from_url(URL) as c:
        yield c


def test_a_countdown_published_while_the_mover_sleeps_is_moved_when_due(
    queue: Queue, client: redis.Redis
) -> None:
    with (
        Connection(URL, transport=INBOX_TRANSPORT, transport_options=ASLEEP) as consuming,
        Connection(URL, transport=INBOX_TRANSPORT, transport_options=ASLEEP) as publishing,
    ):
        # nothing due: the consumer's keeper takes the turn and sleeps its 60 s
        assert consume(consuming, [queue], 1, within=2) == []
        assert client.get(MOVER.format(queue=queue.name)) is not None
        publish_at(publishing, queue, {"n": 1}, datetime.now(UTC) + timedelta(seconds=1))
        assert client.zcard(delayed.key_of(queue.name)) == 1  # waits in Redis until due
        # woken by the push, the holder sleeps until the member's due time: long before
        # its 60 s look (the former mover slept them out)
        assert consume(consuming, [queue], 1, within=15) == [{"n": 1}]
        assert client.zcard(delayed.key_of(queue.name)) == 0


def test_a_message_the_fetch_defers_wakes_the_sleeping_mover_too(
    queue: Queue, client: redis.Redis
) -> None:
    """A producer beside the transport pushes a message with an eta straight into the
    list: the fetch that finds it puts it in the delayed set, and rings as a publish."""
    with (
        Connection(URL, transport=INBOX_TRANSPORT, transport_options=ASLEEP) as publishing,
        Connection(URL, transport=INBOX_TRANSPORT, transport_options=ASLEEP) as consuming,
    ):
        publish_at(publishing, queue, {"n": 2}, datetime.now(UTC) - timedelta(seconds=1))
        raw = json.loads(client.rpop(queue.name) or b"{}")
        assert consume(consuming, [queue], 1, within=2) == []  # asleep: nothing due
        raw["headers"]["eta"] = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
        client.lpush(queue.name, json.dumps(raw))
        assert consume(consuming, [queue], 1, within=15) == [{"n": 2}]


def test_a_push_cuts_a_dead_sleepers_long_turn_short_for_another_consumer(
    queue: Queue, client: redis.Redis
) -> None:
    """A holder that died asleep holds its turn until its planned wake-up plus the slack;
    a member pushed for sooner shortens it to that member's due time plus the slack,
    and the next look of another consumer takes the turn and moves it."""
    turn = MOVER.format(queue=queue.name)
    client.set(turn, "a-consumer-that-died-asleep", px=120_000)
    with (
        Connection(URL, transport=INBOX_TRANSPORT, transport_options=LOOKING) as consuming,
        Connection(URL, transport=INBOX_TRANSPORT, transport_options=LOOKING) as publishing,
    ):
        publish_at(publishing, queue, {"n": 3}, datetime.now(UTC) + timedelta(seconds=0.5))
        assert 0 < client.pttl(turn) <= 0.5 * 1000 + 3_000  # due time plus the slack
        # the former turn ran its 120 s out first
        assert consume(consuming, [queue], 1, within=20) == [{"n": 3}]
        assert client.get(turn) not in (None, b"a-consumer-that-died-asleep")
