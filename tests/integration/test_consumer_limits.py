"""What a rejected message costs in Redis: a 20 MB message from a foreign producer is kept
as a small dead letter (its size, sha256 and head) and a small FAILURE result, never as
copies of itself. Real Redis, real worker (threads), ``MEMORY USAGE`` of the keys.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer

from conventions.observability.deadletters import MAX_RAW_BODY
from conventions.store import keys
from conventions.store.records import Category
from tasks import app
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

HUGE = 20 * 1024 * 1024
#: the most a dead letter or a result of such a message may take in Redis (bytes)
BOUND = 256 * 1024


def _publish(body: Any, task: str = support_jobs.echo.name, **headers: Any) -> str:
    """A foreign producer's message: raw kombu, Celery protocol 2, none of our headers."""
    task_id = str(uuid.uuid4())
    with Connection(app.conf.broker_url) as conn:
        Producer(conn).publish(
            body, exchange=Exchange("email", type="direct"), routing_key="email",
            serializer="json",
            headers={"lang": "py", "task": task, "id": task_id, "root_id": task_id,
                     "retries": 0, "timelimit": [None, None], "argsrepr": "()",
                     "kwargsrepr": "{}", "origin": "foreign", **headers},
        )  # fmt: skip
    return task_id


def _memory(client: redis.Redis, key: str) -> int:
    usage = client.memory_usage(key, samples=0)
    assert usage is not None, f"{key} is not in Redis"
    return int(usage)


def _assert_small(task_id: str, store_redis: redis.Redis, broker_redis: redis.Redis) -> Any:
    record = wait_for(lambda: dead_letter_of(task_id), timeout=60)
    assert _memory(store_redis, keys.dead_letter(record.id)) < BOUND
    result = wait_for(lambda: broker_redis.exists(f"celery-task-meta-{task_id}"), timeout=30)
    assert result
    meta = f"celery-task-meta-{task_id}"
    assert _memory(broker_redis, meta) < BOUND, str(broker_redis.get(meta))[:400]
    assert app.AsyncResult(task_id).state == "FAILURE"
    return record


def test_a_20_mb_body_becomes_a_small_dead_letter_and_a_small_failure(
    store_redis: redis.Redis, broker_redis: redis.Redis
) -> None:
    kwargs = {"call_id": "huge-body", "blob": "x" * HUGE}
    task_id = _publish([[], kwargs, {}])
    record = _assert_small(task_id, store_redis, broker_redis)
    assert record.category is Category.INVALID and "bytes as read from the broker" in record.message
    kept = record.payload  # the entry as read: weighed, never decoded
    body = json.dumps([[], kwargs, {}]).encode()
    assert kept["size"] > len(body) * 4 // 3 and kept["truncated"] is True
    assert kept["kept_bytes"] == MAX_RAW_BODY and len(kept["sha256"]) == 64
    assert kept["raw_body"].startswith('{"body": "')


def test_a_20_mb_header_is_kept_as_its_head(
    store_redis: redis.Redis, broker_redis: redis.Redis
) -> None:
    task_id = _publish([[], {"call_id": "huge-header"}, {}], kwargsrepr="k" * HUGE)
    record = _assert_small(task_id, store_redis, broker_redis)
    assert record.category is Category.INVALID
    assert len(record.headers.get("kwargsrepr", "")) < 4096


def test_a_large_payload_under_the_message_cap_is_kept_small_and_so_is_its_failure(
    store_redis: redis.Redis, broker_redis: redis.Redis
) -> None:
    kwargs = {"call_id": "large-body", "blob": "y" * (900 * 1024)}
    task_id = _publish([[], kwargs, {}])
    record = _assert_small(task_id, store_redis, broker_redis)
    assert "blob" in record.message  # the runner's validation refused it
    assert record.payload["truncated"] is True
