"""Replaying one dead letter from several places at once publishes it once.

The job here has no enqueue reservation (``dedup=None``), so nothing but the replay's own
claim on its record stops a second publish. Each store backend (Redis, PostgreSQL,
SQLite) is tried with operators racing at a barrier; the broker is a real Redis, its
queue one nobody consumes (the published copies are counted there). A replay whose
broker is really unreachable (nothing listens on its port) gives its claim back.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from conventions import App, Id, JobContext, Payload
from conventions.config.profile import reliable
from conventions.ops import replay
from conventions.store.records import Category, DeadLetter
from tests.conftest import BROKER_DB, REDIS_BASE, STORE_DB

pytestmark = pytest.mark.usefixtures("services")

BROKER = f"{REDIS_BASE}/{BROKER_DB}"
#: operators replaying one record at once
OPERATORS = 4
TASK = "testing.replay_claim.v1"


class Item(Payload):
    item_id: Id


def _app(broker: str, store: str, queue: str) -> App:
    app = App(f"replay_claim_{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(
        reliable(broker_url=broker, store_url=store, publish_timeout=2.0),
        result_backend=None,  # no result is read here (a backend per thread would leak)
        conventions_workloads={"email": queue},
        task_default_queue=queue,
    )

    def body(payload: Item, ctx: JobContext) -> None: ...

    app.job(TASK, payload=Item, key="replay-claim:{item_id}", workload="email",
            dedup=None)(body)  # fmt: skip
    return app


@pytest.fixture(params=["redis", "postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, shop_database: str, tmp_path: Any) -> str:
    if request.param == "redis":
        return f"{REDIS_BASE}/{STORE_DB}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return shop_database


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"replay-claim-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(BROKER)
    try:
        client.delete(name, *client.keys(f"*{name}*"))
    finally:
        client.close()


@pytest.fixture
def made() -> Iterator[list[App]]:
    apps: list[App] = []
    yield apps
    for app in apps:
        app.store.close()
        app.close()


def _dead_letter(app: App) -> DeadLetter:
    now = datetime.now(UTC)
    record = DeadLetter(
        id=f"dl-{uuid.uuid4().hex[:10]}", task=TASK, task_id=str(uuid.uuid4()),
        category=Category.PERMANENT, payload={"item_id": "i1"}, headers={},
        idempotency_key=None, exc_type="ValueError", message="refused", traceback="",
        attempts=1, first_failed_at=now, last_failed_at=now, worker="w1",
    )  # fmt: skip
    app.store.put_dead_letter(record)
    return record


def _published(queue: str) -> int:
    client = redis.Redis.from_url(BROKER)
    try:
        return sum(int(client.llen(name)) for name in client.keys(f"{queue}*")
                   if client.type(name) == b"list")  # fmt: skip
    finally:
        client.close()


def test_operators_replaying_one_dead_letter_at_once_publish_it_once(
    store_url: str, queue: str, made: list[App]
) -> None:
    app = _app(BROKER, store_url, queue)
    made.append(app)
    record = _dead_letter(app)
    barrier = threading.Barrier(OPERATORS)
    outcomes: list[Any] = []

    def operator(n: int) -> None:
        barrier.wait(timeout=10)
        try:
            outcomes.append(replay.replay(app, record.id, reason="fixed", actor=f"ops:{n}"))
        except replay.ReplayRefused as refused:
            outcomes.append(refused)

    threads = [threading.Thread(target=operator, args=(n,)) for n in range(OPERATORS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    published = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [str(o) for o in outcomes if isinstance(o, Exception)]
    assert len(outcomes) == OPERATORS
    assert len(published) == 1, f"{len(published)} replays published: {outcomes}"
    assert all("already replayed" in why for why in refused)
    assert _published(queue) == 1
    marked = app.store.get_dead_letter(record.id)
    assert marked is not None and marked.replayed_at is not None


def test_a_replay_whose_broker_is_unreachable_gives_its_claim_back(
    store_url: str, queue: str, made: list[App]
) -> None:
    down = _app("redis://127.0.0.1:1/0", store_url, queue)  # nothing listens on port 1
    made.append(down)
    record = _dead_letter(down)
    with pytest.raises(Exception) as failed:
        replay.replay(down, record.id, reason="fixed", actor="ops:ann")
    assert not isinstance(failed.value, replay.ReplayRefused)
    unmarked = down.store.get_dead_letter(record.id)
    assert unmarked is not None and unmarked.replayed_at is None
    up = _app(BROKER, store_url, queue)
    made.append(up)
    result = replay.replay(up, record.id, reason="fixed, again", actor="ops:ann")
    assert result.deduplicated is False and _published(queue) == 1


def test_the_replayed_event_comes_before_its_jobs_own_events_in_the_trail(
    store_url: str, queue: str, made: list[App]
) -> None:
    """The replay is on the record as of its claim, before the publish: a worker may run
    the job (``published``, ``received``, ``succeeded``) before the publisher hears the
    broker's confirm (on a RabbitMQ cluster, after a majority wrote it), and the trail
    must not say the job was replayed after it succeeded."""
    app = _app(BROKER, store_url, queue)
    made.append(app)
    record = _dead_letter(app)
    correlation = f"corr-{uuid.uuid4().hex[:8]}"
    app.store.put_dead_letter(replace(record, correlation_id=correlation))
    result = replay.replay(app, record.id, reason="fixed", actor="ops:ann")
    trail = [e.event for e in app.store.audit_for(correlation) if e.task_id == result.id]
    assert trail[:2] == ["replayed", "published"], trail
