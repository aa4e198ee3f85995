"""Delayed delivery inside Redis (``conventions.transport.delayed``) on a real Redis: a
message with a countdown or an eta waits in its queue's delayed set, the mover moves it
when due (bounded, in due order), and no consumer ever holds a message not yet due.

The worker side runs in real ``celery worker`` processes in the chaos suite
(``tests/acceptance/test_chaos_time.py``); here each step is driven by hand.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from conventions import App, JobContext
from conventions.config.profile import INBOX_TRANSPORT, reliable
from conventions.config.settings import DELAYED_SET_MAX_COUNTDOWN, max_countdown
from conventions.errors import BackendUnavailable, ConfigurationError
from conventions.jobs import routing
from conventions.store import keys
from conventions.tracing import headers as hdr
from conventions.transport import delayed
from tests.conftest import BROKER_DB, REDIS_BASE, STORE_DB
from tests.fixtures import unavailable
from tests.integration.helpers import SpareRedis
from tests.integration.support_jobs import Call
from tests.integration.test_broker import consume

pytestmark = [pytest.mark.usefixtures("services"), pytest.mark.timeout(60)]

URL = f"{REDIS_BASE}/{BROKER_DB}"
STORE = f"{REDIS_BASE}/{STORE_DB}"
OPTIONS = {"priority_steps": [0], "recovery_timeout": 3, "mover_interval": 0.1}


@pytest.fixture
def connection() -> Iterator[Connection]:
    with Connection(URL, transport=INBOX_TRANSPORT, transport_options=OPTIONS) as c:
        yield c


@pytest.fixture
def queue() -> Queue:
    name = f"delayed-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    with redis.Redis.from_url(URL) as c:
        yield c


def publish_at(connection: Connection, queue: Queue, body: Any, due: datetime) -> None:
    """Publish as Celery's protocol 2 does: the due time in the ``eta`` header."""
    Producer(connection.default_channel).publish(
        body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue],
        headers={"id": str(uuid.uuid4()), "eta": due.isoformat()},
    )  # fmt: skip


def members(client: redis.Redis, queue: str) -> list[tuple[str, dict[str, Any], float]]:
    """The delayed set of ``queue``: (list key, message, due) per member."""
    found = []
    for member, score in client.zrange(delayed.key_of(queue), 0, -1, withscores=True):
        key, message = member.decode().split(delayed.SEP, 1)
        found.append((key, json.loads(message), score))
    return found


def test_a_message_not_yet_due_waits_in_the_delayed_set_without_its_eta(
    connection: Connection, queue: Queue, client: redis.Redis
) -> None:
    week = datetime.now(UTC) + timedelta(days=7)
    publish_at(connection, queue, {"n": 1}, week)
    assert client.llen(queue.name) == 0
    [(key, message, due)] = members(client, queue.name)
    assert key == queue.name and abs(due - week.timestamp()) < 0.001
    assert message["headers"]["eta"] is None  # moved, it is a plain message run at once
    assert datetime.fromisoformat(message["headers"][hdr.DUE]) == week


def test_a_message_due_now_or_in_the_past_goes_straight_to_its_queue(
    connection: Connection, queue: Queue, client: redis.Redis
) -> None:
    publish_at(connection, queue, {"n": 1}, datetime.now(UTC) - timedelta(seconds=5))
    assert (client.llen(queue.name), client.zcard(delayed.key_of(queue.name))) == (1, 0)


def test_the_mover_moves_only_due_members_at_most_its_limit_in_due_order(
    connection: Connection, queue: Queue, client: redis.Redis
) -> None:
    now = datetime.now(UTC)
    for n in (3, 1, 2):  # published out of order
        publish_at(connection, queue, {"n": n}, now + timedelta(seconds=60 + n))
    publish_at(connection, queue, {"n": 9}, now + timedelta(days=1))
    script = client.register_script(delayed.MOVE)
    later = 70.0  # the Redis clock, 70 s on

    first = delayed.move(client, script, [queue.name], later, limit=2)
    assert first.moved == 2 and first.next_due is not None
    second = delayed.move(client, script, [queue.name], later, limit=2)
    assert second.moved == 1
    assert second.next_due == pytest.approx((now + timedelta(days=1)).timestamp())
    assert delayed.move(client, script, [queue.name], later).moved == 0
    # the oldest due first: the fetch takes from the right
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"]))["n"]
              for m in client.lrange(queue.name, 0, -1)]  # fmt: skip
    assert bodies[::-1] == [1, 2, 3]
    assert client.zcard(delayed.key_of(queue.name)) == 1


def test_a_consumer_gets_a_delayed_message_once_when_it_is_due_never_before(
    connection: Connection, queue: Queue, client: redis.Redis
) -> None:
    due = datetime.now(UTC) + timedelta(seconds=1.5)
    publish_at(connection, queue, {"n": 1}, due)
    got = consume(connection, [queue], 1, within=5)
    arrived = time.time()
    assert got == [{"n": 1}]
    assert due.timestamp() <= arrived < due.timestamp() + 2  # on time, within 2 s
    assert client.zcard(delayed.key_of(queue.name)) == 0
    assert consume(connection, [queue], 1, within=1.5) == []  # once


def test_a_message_pushed_into_a_queue_with_a_future_eta_waits_in_the_delayed_set(
    connection: Connection, queue: Queue, client: redis.Redis
) -> None:
    """A producer beside the transport (kombu's own) pushes straight into the list: the
    consumer that fetches it puts it in the delayed set instead of holding it."""
    publish_at(connection, queue, {"n": 1}, datetime.now(UTC) - timedelta(seconds=1))
    raw = json.loads(client.rpop(queue.name) or b"{}")
    raw["headers"]["eta"] = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    client.lpush(queue.name, json.dumps(raw))
    assert consume(connection, [queue], 1, within=1.5) == []
    [(key, message, _)] = members(client, queue.name)
    assert (key, message["headers"]["eta"]) == (queue.name, None)
    assert client.hlen(connection.default_channel.unacked_key) == 0 or all(
        queue.name.encode() not in v for v in client.hvals(connection.default_channel.unacked_key)
    )


# -- through the layer's publish: the countdown cap is gone ------------------------------


@pytest.fixture
def publishers() -> Iterator[list[App]]:
    made: list[App] = []
    yield made
    for app in made:
        app.store.close()
        app.close()


def _job(made: list[App], broker: str, store: str) -> Any:
    app = App(f"delayed_{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(
        reliable(broker_url=broker, store_url=store, result_backend=store),
        conventions_workloads={"email": "email"},
        task_queues=routing.queues_for({"email": "email"}),
        task_routes=(routing.WorkloadRouter({"email": "email"}),),
        task_default_queue="email",
    )
    made.append(app)

    def echo(payload: Call, ctx: JobContext) -> None: ...

    return app.job("testing.delayed.v1", payload=Call, key="delayed:{call_id}",
                   workload="email")(echo)  # fmt: skip


def _in_delayed_set(client: redis.Redis, task_id: str) -> list[float]:
    found = client.zrange("_cc.delayed.email", 0, -1, withscores=True)
    ids = [json.loads(m.decode().split("\n", 1)[1])["headers"]["id"] for m, _ in found]
    return [score for (_, score), found_id in zip(found, ids, strict=True) if found_id == task_id]


def test_a_two_hour_countdown_and_a_seven_day_eta_are_accepted_and_wait_in_redis(
    publishers: list[App], client: redis.Redis
) -> None:
    job = _job(publishers, URL, STORE)
    assert max_countdown(job.app.conf) == DELAYED_SET_MAX_COUNTDOWN
    week = datetime.now(UTC) + timedelta(days=7)
    two_hours = job.apply_async(kwargs={"call_id": f"c{uuid.uuid4().hex[:8]}"}, countdown=7200)
    seven_days = job.apply_async(kwargs={"call_id": f"e{uuid.uuid4().hex[:8]}"}, eta=week)
    try:
        [first] = _in_delayed_set(client, two_hours.id)
        [second] = _in_delayed_set(client, seven_days.id)
        assert abs(first - (time.time() + 7200)) < 60
        assert second == pytest.approx(week.timestamp())
        assert client.llen("email") == 0 or two_hours.id not in str(client.lrange("email", 0, -1))
    finally:
        for member in client.zrange("_cc.delayed.email", 0, -1):
            if two_hours.id in member.decode() or seven_days.id in member.decode():
                client.zrem("_cc.delayed.email", member)


def test_a_duplicate_delayed_publish_is_deduplicated_by_its_reservation(
    publishers: list[App], client: redis.Redis
) -> None:
    job = _job(publishers, URL, STORE)
    call_id = f"d{uuid.uuid4().hex[:8]}"
    first = job.apply_async(kwargs={"call_id": call_id}, countdown=3600)
    second = job.apply_async(kwargs={"call_id": call_id}, countdown=3600)
    try:
        assert (first.deduplicated, second.deduplicated) == (False, True)
        assert second.id == first.id
        assert len(_in_delayed_set(client, first.id)) == 1
        with redis.Redis.from_url(STORE, decode_responses=True) as store:
            assert store.get(keys.dedup(f"testing.delayed:delayed:{call_id}")) == first.id
    finally:
        for member in client.zrange("_cc.delayed.email", 0, -1):
            if first.id in member.decode():
                client.zrem("_cc.delayed.email", member)


def test_a_countdown_beyond_a_year_is_still_refused(publishers: list[App]) -> None:
    job = _job(publishers, URL, STORE)
    with pytest.raises(ConfigurationError, match="safe maximum"):
        job.apply_async(kwargs={"call_id": "y1"}, countdown=DELAYED_SET_MAX_COUNTDOWN + 60)


@pytest.fixture
def spare() -> Iterator[SpareRedis]:
    if shutil.which("redis-server") is None:
        unavailable("redis-server (a backend of the test's own)", FileNotFoundError())
    server = SpareRedis()
    server.start()
    yield server
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


def test_a_delayed_publish_to_a_stopped_broker_raises_backend_unavailable_enqueues_nothing(
    spare: SpareRedis, publishers: list[App]
) -> None:
    broker = f"redis://127.0.0.1:{spare.port}/0"
    job = _job(publishers, broker, STORE)
    spare.stop()
    call_id = f"u{uuid.uuid4().hex[:8]}"
    with pytest.raises(BackendUnavailable) as refused:
        job.apply_async(kwargs={"call_id": call_id}, countdown=7200)
    assert refused.value.backend == "broker"
    with redis.Redis.from_url(STORE, decode_responses=True) as store:  # given back
        assert store.get(keys.dedup(f"testing.delayed:delayed:{call_id}")) is None
    spare.start()
    with redis.Redis.from_url(broker) as fresh:
        assert fresh.zcard("_cc.delayed.email") == 0


def test_a_delayed_publish_with_the_store_stopped_raises_backend_unavailable(
    spare: SpareRedis, publishers: list[App], client: redis.Redis
) -> None:
    store = f"redis://127.0.0.1:{spare.port}/0"
    job = _job(publishers, URL, store)
    spare.stop()
    task_id = str(uuid.uuid4())
    with pytest.raises(BackendUnavailable) as refused:
        job.apply_async(kwargs={"call_id": "s1"}, countdown=7200, task_id=task_id)
    assert refused.value.backend == "store"
    assert _in_delayed_set(client, task_id) == []


def test_kombus_own_redis_transport_keeps_the_countdown_cap() -> None:
    conf = reliable(broker_url=URL, store_url=STORE, allow={"broker_transport"},
                    broker_transport="redis", visibility_timeout=600)  # fmt: skip
    assert max_countdown(conf) == 540.0
    assert max_countdown({"broker_url": "filesystem://"}) == 900.0


def test_a_message_published_at_once_drops_a_former_due_time(
    connection: Connection, queue: Queue, client: redis.Redis
) -> None:
    """A retry without a countdown copies its request's headers, ``cc_due`` included: the
    queues view would count its age from the former due time."""
    Producer(connection.default_channel).publish(
        {"n": 1}, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue],
        headers={"id": str(uuid.uuid4()), hdr.DUE: "2026-01-01T00:00:00+00:00"},
    )  # fmt: skip
    [raw] = client.lrange(queue.name, 0, -1)
    assert hdr.DUE not in json.loads(raw)["headers"]
