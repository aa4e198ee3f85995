"""Poison messages of every kind, published raw: each ends as a dead-letter record with
its reason (the raw body kept when the message cannot be read as a job), and the worker
keeps serving: a normal payment published afterwards is applied.

A real ``celery -A tasks worker`` on a Redis server of the test's own; the messages are
pushed with kombu or straight into the Redis list, as a foreign or broken producer would.
"""

from __future__ import annotations

import base64
import pickle
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Exchange, Producer
from sqlalchemy import Engine

from conventions.store import Store, open_store
from conventions.store.records import Category, DeadLetter
from tests.acceptance.support_chaos import (
    LOST,
    RedisServer,
    Worker,
    own_redis,
    scalar,
    shop_database,
    worker_env,
)

pytestmark = pytest.mark.chaos

QUEUE = "email"
#: an entry that is not a kombu message at all (not JSON, not UTF-8)
JUNK = b"\xff\x00 not a message"
INCLUDE = "tests.acceptance.support_poison"


def _headers(task: str, task_id: str) -> dict[str, Any]:
    """Celery protocol 2 headers, as a foreign producer sends them."""
    return {
        "lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None,
        "group": None, "retries": 0, "eta": None, "expires": None,
        "timelimit": [None, None], "argsrepr": "()", "kwargsrepr": "{}", "origin": "poison",
    }  # fmt: skip


class RawProducer:
    """Publishes whatever it is given to the ``email`` queue of the chaos Redis."""

    def __init__(self, url: str) -> None:
        self.connection = Connection(url)
        self.producer = Producer(self.connection)
        self.exchange = Exchange(QUEUE, type="direct")

    def send(self, body: Any, task: str | None, **options: Any) -> str:
        task_id = str(uuid.uuid4())
        self.producer.publish(
            body, exchange=self.exchange, routing_key=QUEUE,
            headers=_headers(task, task_id) if task else {}, **options,
        )  # fmt: skip
        return task_id

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def shop() -> Iterator[Engine]:
    with shop_database(orders=2) as engine:
        yield engine


@pytest.fixture
def chaos_redis(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    with own_redis(folder) as server:
        yield server


def _by_task_id(store: Store) -> dict[str, DeadLetter]:
    return {record.task_id: record for record in store.list_dead_letters(limit=1000)}


def _without_id(store: Store) -> list[DeadLetter]:
    return [r for r in store.list_dead_letters(limit=1000) if r.task_id == ""]


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_poison_messages_of_every_kind_are_dead_lettered_and_the_worker_keeps_serving(
    chaos_redis: RedisServer, shop: Engine, tmp_path: Path
) -> None:
    env = worker_env(chaos_redis, shop)
    worker = Worker("tasks", "poison", QUEUE, env, tmp_path, include=INCLUDE).wait_ready()
    store = open_store(chaos_redis.url(1))
    raw = RawProducer(chaos_redis.url(0))
    apply = "payments.apply_event.v1"
    try:
        sent = {
            "malformed JSON": raw.send(
                b'{"event_id": evt_0001', apply,
                content_type="application/json", content_encoding="utf-8",
            ),
            "not a Celery message": raw.send({"hello": "world"}, None, serializer="json"),
            "pickle": raw.send(
                pickle.dumps([[], {"event_id": "evt_0001"}, {}]), apply,
                content_type="application/x-python-serialize", content_encoding="binary",
            ),
            "unknown task": raw.send([[], {}, {}], "nosuch.task.v1", serializer="json"),
            "wrong kwargs": raw.send([[], {"event": "evt_0001"}, {}], apply, serializer="json"),
            "wrong body shape": raw.send({"event_id": "evt_0001"}, apply, serializer="json"),
            "kills its worker": raw.send(
                [[], {"pill_id": "p1"}, {}], "testing.kill_worker.v1", serializer="json"
            ),
        }  # fmt: skip
        # not even a kombu message: bytes pushed straight into the queue's list
        raw.connection.default_channel.client.lpush(QUEUE, JUNK)
        # the two messages with no id are found by their raw bodies
        _wait_for(lambda: store.count_dead_letters() == len(sent) + 1, 120, "every dead letter")
        records = _by_task_id(store)
        junk = next(r for r in _without_id(store) if "raw_body_base64" in r.payload)
        assert (junk.category, base64.b64decode(junk.payload["raw_body_base64"])) == (
            Category.UNPARSEABLE, JUNK,
        )  # fmt: skip
        # the consumer's dead letters count in the metrics and have a trail, as a job's do
        trail = store.audit_for(junk.correlation_id or "")
        assert [(e.event, e.detail["dead_letter_id"]) for e in trail] == [
            ("dead_lettered", junk.id)
        ]
        counted = sum(
            n for (name, _), n in store.counters().items() if name.startswith("dead_lettered:")
        )
        assert counted == len(sent) + 1
        expected = {
            "malformed JSON": (Category.UNPARSEABLE, "cannot decode the body"),
            "not a Celery message": (Category.UNPARSEABLE, "not a Celery task message"),
            "pickle": (Category.INVALID, "refused task message"),
            "unknown task": (Category.INVALID, "unknown task 'nosuch.task.v1'"),
            "wrong kwargs": (Category.INVALID, "failed validation"),
            "wrong body shape": (Category.UNPARSEABLE, "malformed task message"),
            "kills its worker": (Category.POISON, "keeps killing its worker"),
        }
        unknown = next(r for r in _without_id(store) if "raw_body" in r.payload)
        for kind, (category, reason) in expected.items():
            record = unknown if kind == "not a Celery message" else records[sent[kind]]
            assert (record.category, kind) == (category, kind), record
            assert reason in record.message, (kind, record.message)
        # what cannot be read is kept as it arrived, for inspection
        assert records[sent["malformed JSON"]].payload["raw_body"] == '{"event_id": evt_0001'
        assert unknown.payload["raw_body"] == '{"hello": "world"}'
        assert "raw_body_base64" in records[sent["pickle"]].payload
        assert records[sent["wrong body shape"]].payload["raw_body"] == '{"event_id": "evt_0001"}'

        # the worker kept serving: the same main process applies a normal payment
        assert worker.alive()
        normal = raw.send([[], {"event_id": "evt_0001"}, {}], apply, serializer="json")
        _wait_for(lambda: scalar(shop, LOST) == 1, 60, "the normal payment")
        assert worker.alive()
        assert normal not in _by_task_id(store)
        assert "Unrecoverable error" not in worker.output()
    finally:
        raw.close()
        store.close()
        worker.terminate()
