"""The one-trip publish writes the reservation where the store looks, whatever server the
message actually goes to.

Celery publishes through ``broker_write_url`` when it is set, through the live member of
a failover list, or through a connection the caller passes. The reservation and the
``published`` event must land in the store (the layer's Redis database 15 of this run's
server) in every case: otherwise the job completes, the store releases nothing, and every
later ``.delay()`` of the key is deduplicated for 7 days against a job that is gone.

The "other server" is a Redis of the test's own on a spare port (``SpareRedis``), with a
real worker process that consumes from it.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from conventions import App, JobContext, bind
from conventions.store import keys
from conventions.task import ConventionTask
from conventions.transport import publish as onetrip
from tasks import app
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.fixtures import WorkerProcess, unavailable
from tests.integration.helpers import SpareRedis, wait_for
from tests.integration.support_jobs import Call

pytestmark = pytest.mark.usefixtures("clean_store")


@pytest.fixture
def spare_broker() -> Iterator[str]:
    """A second Redis server; its URL, in the broker's database number."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server (a broker server of the test's own)",
                    FileNotFoundError("redis-server"))  # fmt: skip
    spare = SpareRedis()
    spare.start()
    yield f"redis://127.0.0.1:{spare.port}/{BROKER_DB}"
    spare.stop()


def _publisher(**conf: Any) -> tuple[App, ConventionTask]:
    """An app configured like the reference one (plus ``conf``) and its ``testing.echo.v1``,
    which the workers run from ``tests.integration.support_jobs``."""
    other = App(f"publisher_{uuid.uuid4().hex[:6]}", set_as_current=False)
    other.config_from_object("celeryconfig")
    other.conf.update(conf)

    def echo(payload: Call, ctx: JobContext) -> None: ...

    job = other.job("testing.echo.v1", payload=Call, key="echo:{call_id}", workload="email")(echo)
    return other, job


def _held_by(store_redis: redis.Redis, key: str) -> str | None:
    """Who holds ``key``'s reservation in the store's database (a read, no side effect)."""
    value = store_redis.get(keys.dedup(key, app.store.prefix))
    return value.decode() if isinstance(value, bytes) else value


def _round_trip(job: ConventionTask, store_redis: redis.Redis, **options: Any) -> None:
    """Publish, find the reservation and the ``published`` event in the store, let the
    job complete, publish the key again: a new job, not a duplicate of the first."""
    call_id = f"c{uuid.uuid4().hex[:10]}"
    correlation = f"corr-{call_id}"
    with bind(correlation_id=correlation):
        first = job.apply_async(kwargs={"call_id": call_id}, **options)
    # the reservation holds the key until the job is done: a worker may have run it
    # already (the no-op is fast), and given the key back
    holder = _held_by(store_redis, f"testing.echo:echo:{call_id}")
    assert holder == first.id or (holder is None and wait_for(first.ready, 10))
    # the first event is the publish (a worker may have started the job already)
    assert [e.event for e in app.store.audit_for(correlation)][:1] == ["published"]
    assert first.get(timeout=60)["call_id"] == call_id
    again = job.apply_async(kwargs={"call_id": call_id}, **options)
    assert again.deduplicated is False and again.id != first.id
    again.get(timeout=60)  # a new job: the ledger knows the key is done and skips the body
    assert again.state == "SUCCESS"


def test_a_write_url_on_another_server_reserves_in_the_store(
    spare_broker: str,
    store_redis: redis.Redis,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    worker_process("spare", "email", CELERY_BROKER_URL=spare_broker)
    publisher, job = _publisher(broker_write_url=spare_broker)
    try:
        _round_trip(job, store_redis)
    finally:
        publisher.store.close()
        publisher.close()


def test_a_connection_to_another_server_passed_by_the_caller_reserves_in_the_store(
    spare_broker: str,
    store_redis: redis.Redis,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    worker_process("spare", "email", CELERY_BROKER_URL=spare_broker)
    echo = app.tasks["testing.echo.v1"]
    assert onetrip.eligible(app, app.store)  # the app's own broker shares the store's server
    with app.connection_for_write(spare_broker) as connection:
        _round_trip(echo, store_redis, connection=connection)


def test_a_failover_list_takes_the_two_step_path(
    store_redis: redis.Redis, thread_worker: Any
) -> None:
    first = f"{REDIS_BASE}/{BROKER_DB}"  # the store's server, then one that may take over
    publisher, job = _publisher(broker_url=f"{first};redis://127.0.0.1:1/{BROKER_DB}")
    try:
        assert not onetrip.eligible(publisher, publisher.store)
        _round_trip(job, store_redis)
    finally:
        publisher.store.close()
        publisher.close()


@pytest.mark.parametrize(
    "conf",
    [
        # a Sentinel broker whose store is a fixed server, not its group's primary (a
        # store of the same group is one trip: tests/integration/test_sentinel.py)
        {
            "broker_url": f"sentinel://127.0.0.1:26379/{BROKER_DB}",
            "broker_transport_options": {"master_name": "mymaster"},
        },
        {"broker_url": [f"{REDIS_BASE}/{BROKER_DB}", f"redis://127.0.0.1:1/{BROKER_DB}"]},
        {"broker_write_url": f"redis://queue-writer.internal:6379/{BROKER_DB}"},
        {"broker_write_url": f"{REDIS_BASE}/{BROKER_DB};redis://127.0.0.1:1/{BROKER_DB}"},
    ],
    ids=["sentinel-store-elsewhere", "a-list", "write-url-elsewhere", "write-url-failover"],
)
def test_a_broker_that_may_publish_elsewhere_takes_the_two_step_path(
    conf: dict[str, Any],
) -> None:
    publisher, _ = _publisher(**conf)
    try:
        assert not onetrip.eligible(publisher, app.store)
    finally:
        publisher.close()
