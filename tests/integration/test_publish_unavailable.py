"""``.delay()`` with the broker or the store down raises one ``BackendUnavailable`` within
the profile's publish timeout: a one-line message, ``backend`` naming which one, nothing
enqueued and no enqueue reservation left once the backend is back, and the same app
publishes again then.

The backend that goes down is a Redis server of the test's own (``SpareRedis``): stopped
(its port refuses connections) or frozen (``SIGSTOP``: connections are accepted and never
answered, as in a partition); the machine's Redis is the other backend. No timing is
asserted: the timeout mark guards against a hang, and the elapsed time is printed
(``pytest -s`` shows it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from conventions import App, JobContext
from conventions.config.profile import reliable
from conventions.errors import BackendUnavailable
from conventions.jobs import routing
from conventions.store import keys
from conventions.task import ConventionTask
from tests.conftest import BROKER_DB, REDIS_BASE, STORE_DB
from tests.fixtures import unavailable
from tests.integration.helpers import SentEvents, SpareRedis
from tests.integration.support_jobs import Call

pytestmark = [pytest.mark.usefixtures("services"), pytest.mark.timeout(60)]

BROKER = f"{REDIS_BASE}/{BROKER_DB}"
STORE = f"{REDIS_BASE}/{STORE_DB}"


@pytest.fixture
def spare() -> Iterator[SpareRedis]:
    """A Redis server of the test's own, running; stopped (and thawed) at the end."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server (a backend of the test's own)", FileNotFoundError())
    server = SpareRedis()
    server.start()
    yield server
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


@pytest.fixture
def publishers() -> Iterator[list[App]]:
    made: list[App] = []
    yield made
    for app in made:
        app.store.close()
        app.close()


def _publisher(made: list[App], broker: str, store: str, results: str, **profile: Any) -> Any:
    """A web process's app: the reliable profile and one job, no worker."""
    app = App(f"unavailable_{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(
        reliable(broker_url=broker, store_url=store, result_backend=results, **profile),
        conventions_workloads={"email": "email"},
        task_queues=routing.queues_for({"email": "email"}),
        task_routes=(routing.WorkloadRouter({"email": "email"}),),
        task_default_queue="email",
    )
    made.append(app)

    def echo(payload: Call, ctx: JobContext) -> None: ...

    return app.job("testing.unavailable.v1", payload=Call, key="unavailable:{call_id}",
                   workload="email")(echo)  # fmt: skip


def _refused(job: ConventionTask, call_id: str, task_id: str) -> BackendUnavailable:
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as refused:
        job.apply_async(kwargs={"call_id": call_id}, task_id=task_id)
    elapsed = time.monotonic() - started
    print(f"\nBackendUnavailable({refused.value.backend!r}) after {elapsed:.2f}s: {refused.value}")
    assert "\n" not in str(refused.value)
    assert "nothing was published" in str(refused.value)
    return refused.value


def _queued(url: str) -> list[str]:
    """The ids of the messages waiting in the ``email`` queue of the broker at ``url``."""
    with redis.Redis.from_url(url) as client:
        return [json.loads(body)["headers"]["id"] for body in client.lrange("email", 0, -1)]


def _held_by(url: str, call_id: str) -> str | None:
    """Who holds the job's enqueue reservation in the store at ``url``."""
    with redis.Redis.from_url(url, decode_responses=True) as client:
        held = client.get(keys.dedup(f"testing.unavailable:unavailable:{call_id}"))
    return held if isinstance(held, str) else None


def _published_again(job: ConventionTask, call_id: str, broker: str, store: str) -> None:
    """Once the backend is back the same app publishes the job: the check sees it."""
    again = job.apply_async(kwargs={"call_id": call_id})
    assert again.deduplicated is False
    assert _queued(broker).count(again.id) == 1
    assert _held_by(store, call_id) == again.id
    with redis.Redis.from_url(broker) as client:  # no other test's worker gets it
        for body in client.lrange("email", 0, -1):
            if json.loads(body)["headers"]["id"] == again.id:
                client.lrem("email", 1, body)


def test_a_publish_to_a_stopped_broker_raises_backend_unavailable_and_enqueues_nothing(
    spare: SpareRedis, publishers: list[App]
) -> None:
    broker = f"redis://127.0.0.1:{spare.port}/0"
    job = _publisher(publishers, broker, STORE, BROKER)
    spare.stop()
    call_id, task_id = f"b{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    assert _refused(job, call_id, task_id).backend == "broker"
    assert _held_by(STORE, call_id) is None  # the reservation was given back
    spare.start()
    assert task_id not in _queued(broker)
    _published_again(job, call_id, broker, STORE)


def test_a_publish_with_the_store_stopped_raises_backend_unavailable_and_enqueues_nothing(
    spare: SpareRedis, publishers: list[App]
) -> None:
    store = f"redis://127.0.0.1:{spare.port}/0"
    job = _publisher(publishers, BROKER, store, BROKER)
    spare.stop()
    call_id, task_id = f"s{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    assert _refused(job, call_id, task_id).backend == "store"
    assert task_id not in _queued(BROKER)
    spare.start()
    assert _held_by(store, call_id) is None
    _published_again(job, call_id, BROKER, store)


def test_one_stopped_redis_for_broker_results_and_store_fails_the_publish_at_once(
    spare: SpareRedis, publishers: list[App]
) -> None:
    """The reference layout (one Redis for all three): Celery's result subscription used
    to retry for about 19 s, then print a traceback."""
    url = f"redis://127.0.0.1:{spare.port}/0"
    job = _publisher(publishers, url, url, url)
    spare.stop()
    call_id, task_id = f"a{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    assert _refused(job, call_id, task_id).backend == "broker"
    spare.start()
    assert task_id not in _queued(url)
    assert _held_by(url, call_id) is None
    _published_again(job, call_id, url, url)


def test_a_broker_that_never_answers_fails_the_publish_after_the_publish_timeout(
    spare: SpareRedis, publishers: list[App]
) -> None:
    assert spare.proc is not None
    broker = f"redis://127.0.0.1:{spare.port}/0"
    job = _publisher(publishers, broker, STORE, BROKER, publish_timeout=1)
    os.kill(spare.proc.pid, signal.SIGSTOP)
    call_id, task_id = f"f{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    try:
        refused = _refused(job, call_id, task_id)
    finally:
        os.kill(spare.proc.pid, signal.SIGCONT)
    assert refused.backend == "broker" and "publish timeout 1s" in str(refused)
    assert _held_by(STORE, call_id) is None
    assert task_id not in _queued(broker)
    _published_again(job, call_id, broker, STORE)


def test_a_one_trip_publish_after_its_redis_restarted_pushes_once_with_its_event(
    spare: SpareRedis, publishers: list[App]
) -> None:
    """The push waits for the task-sent event and runs inside its publish: with every
    pooled connection dead (the server restarted under them), the publish still pushes
    the message once and publishes its event once."""
    url = f"redis://127.0.0.1:{spare.port}/0"
    job = _publisher(publishers, url, url, url)
    job.apply_async(kwargs={"call_id": f"w{uuid.uuid4().hex[:8]}"})  # the pools are made
    spare.stop()
    spare.start()
    call_id = f"r{uuid.uuid4().hex[:8]}"
    with SentEvents(url) as events:
        handle = job.apply_async(kwargs={"call_id": call_id})
        sent = events.received(call_id)
    assert _queued(url).count(handle.id) == 1
    assert [event["uuid"] for event in sent] == [handle.id]
