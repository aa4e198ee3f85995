"""A job Celery discards gives its idempotency key back, and an operator can clear one.

Revoke (``app.control.revoke``, Flower's button) and ``expires`` make Celery's worker drop
the message without running it. The ``until_done`` reservation must go with it, or every
later ``.delay()`` of the key is deduplicated for 7 days against a job that no longer
exists. A purged queue cannot be seen message by message: ``conventions keys show`` and
``conventions keys clear`` inspect and clear one key, audited with actor and reason.

The worker is a real ``celery worker`` process (prefork): Celery sends ``task_revoked`` in
its main process, where the layer listens.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from kombu import Exchange

from conventions import bind
from conventions.cli.main import main
from conventions.store import keys
from conventions.store.records import AuditEvent, utcnow
from conventions.tracing import headers as hdr
from tasks import app
from tests.fixtures import WorkerProcess
from tests.integration.helpers import wait_for
from tests.integration.support_jobs import echo

pytestmark = pytest.mark.usefixtures("clean_store")


@pytest.fixture
def worker(worker_process: Callable[..., WorkerProcess]) -> Iterator[WorkerProcess]:
    yield worker_process("reservations", "email", concurrency=1)


@pytest.fixture
def call_id() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


def _held_by(store_redis: redis.Redis, key: str) -> str | None:
    """Who holds ``key``'s reservation (read straight from the store's database)."""
    value = store_redis.get(keys.dedup(key, app.store.prefix))
    return value.decode() if isinstance(value, bytes) else value


def _event(correlation: str, name: str, task_id: str) -> AuditEvent | None:
    found = [e for e in app.store.audit_for(correlation) if e.event == name]
    return next((e for e in found if e.task_id == task_id), None)


def _publishes_again(call_id: str) -> None:
    """The key is free: a new ``.delay()`` is a new job, and it runs."""
    again = echo.delay(call_id=call_id)
    assert again.deduplicated is False
    assert again.get(timeout=60)["call_id"] == call_id


def test_a_revoked_job_gives_its_key_back(
    worker: WorkerProcess, store_redis: redis.Redis, call_id: str
) -> None:
    correlation = f"corr-{call_id}"
    with bind(correlation_id=correlation):
        waiting = echo.apply_async(kwargs={"call_id": call_id}, countdown=3)
    assert _held_by(store_redis, f"testing.echo:echo:{call_id}") == waiting.id
    app.control.revoke(waiting.id)
    revoked = wait_for(lambda: _event(correlation, "revoked", waiting.id), timeout=30)
    assert revoked.idempotency_key == f"echo:{call_id}"
    assert _held_by(store_redis, f"testing.echo:echo:{call_id}") is None
    _publishes_again(call_id)


def test_a_job_expired_on_receipt_gives_its_key_back(
    worker: WorkerProcess, store_redis: redis.Redis, call_id: str
) -> None:
    correlation = f"corr-{call_id}"
    with bind(correlation_id=correlation):
        stale = echo.apply_async(
            kwargs={"call_id": call_id}, expires=utcnow() - timedelta(seconds=1)
        )
    expired = wait_for(lambda: _event(correlation, "expired", stale.id), timeout=30)
    assert expired.detail.get("expired") is True
    assert _held_by(store_redis, f"testing.echo:echo:{call_id}") is None
    _publishes_again(call_id)


def test_a_message_without_our_headers_is_released_by_the_key_of_its_kwargs(
    worker: WorkerProcess, store_redis: redis.Redis, call_id: str
) -> None:
    """A message from an older producer carries no key header: the key is computed from
    its kwargs and the task's template."""
    task_id = str(uuid.uuid4())
    assert app.store.reserve(f"testing.echo:echo:{call_id}", task_id, 600) is None
    with app.producer_or_acquire() as producer:
        producer.publish(
            [[], {"call_id": call_id}, {"callbacks": None, "errbacks": None, "chain": None,
                                        "chord": None}],
            exchange=Exchange("email", type="direct"), routing_key="email", serializer="json",
            headers={"lang": "py", "task": echo.name, "id": task_id, "root_id": task_id,
                     "parent_id": None, "group": None, "retries": 0, "eta": None,
                     "expires": (utcnow() - timedelta(seconds=1)).isoformat(),
                     "timelimit": [None, None], "argsrepr": "()", "kwargsrepr": "{}"},
        )  # fmt: skip
    wait_for(lambda: _held_by(store_redis, f"testing.echo:echo:{call_id}") is None, timeout=30)
    _publishes_again(call_id)


def test_a_revoke_never_drops_a_reservation_another_job_holds(
    worker: WorkerProcess, store_redis: redis.Redis, call_id: str
) -> None:
    """A stale message of the key (say, published before an operator cleared it) expires
    while a newer job holds the key: the newer job keeps it."""
    with bind(correlation_id=f"corr-{call_id}"):
        holder = echo.apply_async(kwargs={"call_id": call_id}, countdown=5)
    with app.producer_or_acquire() as producer:
        stale_id = str(uuid.uuid4())
        producer.publish(
            [[], {"call_id": call_id}, {"callbacks": None, "errbacks": None, "chain": None,
                                        "chord": None}],
            exchange=Exchange("email", type="direct"), routing_key="email", serializer="json",
            headers={"lang": "py", "task": echo.name, "id": stale_id, "root_id": stale_id,
                     "parent_id": None, "group": None, "retries": 0, "eta": None,
                     "expires": (utcnow() - timedelta(seconds=1)).isoformat(),
                     "timelimit": [None, None], "argsrepr": "()", "kwargsrepr": "{}",
                     hdr.IDEMPOTENCY_KEY: f"echo:{call_id}",
                     hdr.CORRELATION: f"corr-stale-{call_id}"},
        )  # fmt: skip
    wait_for(lambda: _event(f"corr-stale-{call_id}", "expired", stale_id), timeout=30)
    assert _held_by(store_redis, f"testing.echo:echo:{call_id}") == holder.id
    app.control.revoke(holder.id)  # and leave nothing behind for the next test
    wait_for(lambda: _event(f"corr-{call_id}", "revoked", holder.id), timeout=30)


# -- the operator command ---------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["-A", "tasks", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_keys_show_prints_the_reservation_and_the_ledger_entry(
    capsys: pytest.CaptureFixture[str], call_id: str
) -> None:
    key = f"echo:{call_id}"
    assert app.store.reserve(key, "job-1", 600) is None
    app.store.claim(key, "run-1", 600, "job-1")
    code, out, _ = _cli(capsys, "keys", "show", key, "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["key"] == key
    assert shown["reserved_by"] == "job-1"
    assert shown["ledger_state"] == "running" and shown["ledger_owner"] == "run-1"
    code, out, _ = _cli(capsys, "keys", "show", key)
    assert code == 0 and "job-1" in out and "running" in out


def test_keys_clear_frees_the_key_and_audits_who_and_why(
    capsys: pytest.CaptureFixture[str], store_redis: redis.Redis, call_id: str
) -> None:
    key = f"echo:{call_id}"
    assert app.store.reserve(key, "job-gone", 600) is None
    app.store.claim(key, "run-gone", 600, "job-gone")
    code, out, _ = _cli(capsys, "keys", "clear", key, "--actor", "alice",
                        "--reason", "queue purged (INC-42)")  # fmt: skip
    assert code == 0, out
    assert _held_by(store_redis, key) is None
    state = app.store.key_state(key)
    assert state.reserved_by is None and state.ledger_state is None
    [cleared] = [e for e in app.store.audit_for(f"key:{key}") if e.event == "key_cleared"]
    assert cleared.detail["actor"] == "alice"
    assert cleared.detail["reason"] == "queue purged (INC-42)"
    assert cleared.detail["reserved_by"] == "job-gone"
    assert cleared.idempotency_key == key


@pytest.mark.parametrize("reason", [None, "  "])
def test_keys_clear_is_refused_without_a_reason(
    capsys: pytest.CaptureFixture[str], store_redis: redis.Redis, call_id: str, reason: Any
) -> None:
    key = f"echo:{call_id}"
    assert app.store.reserve(key, "job-1", 600) is None
    argv = ["keys", "clear", key, "--actor", "alice"]
    if reason is not None:
        argv += ["--reason", reason]
    code, _, err = _cli(capsys, *argv)
    assert code == 2
    assert "--reason" in err and len(err.strip().splitlines()) == 1
    assert _held_by(store_redis, key) == "job-1"
