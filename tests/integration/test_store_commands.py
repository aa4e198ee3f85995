"""The Redis store's scripts send no command a job does not need (#32): read by
``MONITOR`` on the real store Redis, one job's life (publish, claim, complete, each with
its audit event and run change) in a store of the test's own prefix.

Each assertion names a command the scripts sent before: the reservation's ``GET`` before
its ``SET``, the count of an index that an update cannot grow, the done bucket of a day
that has ended, the ``DEL`` of a ledger entry that is not there, the delivery counter's
own ``DEL``, the result's read before its write."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from conventions.observability import audit
from conventions.store import RedisStore, redis_done
from conventions.store.redis_results import ResultWrite
from conventions.tracing import headers as hdr
from tests.conftest import REDIS_BASE, STORE_DB
from tests.integration.helpers import Monitor

TASK = "billing.charge.v2"


@pytest.fixture
def store() -> Iterator[RedisStore]:
    client = redis.Redis.from_url(f"{REDIS_BASE}/{STORE_DB}", decode_responses=True)
    yield RedisStore(client, prefix=f"cc-cmds-{uuid.uuid4().hex}:")
    client.close()


def _scripted(monitor: Monitor, prefix: str) -> list[list[str]]:
    """The commands scripts ran that name the store's prefix (TIME names no key), split."""
    return [line["command"].split() for line in monitor.lines
            if line.get("client_type") == "lua" and prefix in line["command"]]  # fmt: skip


def _names(commands: list[list[str]]) -> list[str]:
    return [command[0].upper() for command in commands]


def _headers(correlation: str, key: str) -> dict[str, Any]:
    return {hdr.CORRELATION: correlation, hdr.IDEMPOTENCY_KEY: key}


def test_one_jobs_life_sends_only_the_commands_it_needs(store: RedisStore) -> None:
    key, job, correlation = f"charge:{uuid.uuid4().hex}", uuid.uuid4().hex, uuid.uuid4().hex
    head = _headers(correlation, key)
    result_key = f"celery-task-meta-{job}"
    store.client.set(result_key, '{"status": "PENDING"}', ex=60)  # a value the write meets
    with Monitor() as monitor:
        assert store.reserve(key, job, 60, audit=audit.event("published", TASK, job, head)) is None
    publish = _scripted(monitor, store.prefix)
    started = ResultWrite(result_key, '{"status": "STARTED"}', 60, STORE_DB)
    with Monitor() as monitor:
        started_event = audit.event("started", TASK, job, head, attempt=1)
        store.claim(key, "owner-1", 30, "delivery-1", audit=started_event, result=started)
    claim = _scripted(monitor, store.prefix)
    claim_result = monitor.scripted(result_key)
    with Monitor() as monitor:
        store.complete(key, "owner-1", "succeeded", 3600, job,
                       audit=audit.event("succeeded", TASK, job, head, attempt=1),
                       delivery_id="delivery-1")  # fmt: skip
    complete = _scripted(monitor, store.prefix)

    # the reservation: one SET NX GET takes the key or answers its holder
    dedup = [c for c in publish if c[1].strip('"').endswith(key) and "print" not in c[1]]
    assert _names(dedup) == ["SET"], dedup
    assert "NX" in dedup[0] and "GET" in dedup[0]
    # the trail's first event counts the trails (it may grow the index); later ones don't
    assert _names(publish).count("ZCARD") == 2  # the trails and the runs, once each
    assert "ZCARD" not in _names(claim) + _names(complete)
    # the claim reads the done buckets of the days that have not ended: yesterday's is out
    buckets = len(redis_done.days(store.done_horizon))
    assert _names(claim).count("HGET") == buckets - 1
    # a fresh key has no ledger entry to drop before it is taken
    assert "DEL" not in _names(claim)
    # the completion drops the ledger entry and the delivery counter in one DEL
    assert _names(complete).count("DEL") == 2  # that one, and the reservation's
    assert any(c[0].upper() == "DEL" and len(c) == 3 for c in complete), complete
    # the STARTED write reads what it replaced in the same SET (no GET of its own)
    assert claim_result == ["SET", "PUBLISH"]
