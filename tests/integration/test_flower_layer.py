"""What Flower shows of the layer, against a real Flower and real workers on Redis: the
correlation id in the kwargs of every publish (a retry too), the kwargs column the how-to
turns on, a dead letter's category and id in the task's traceback, and the Broker page
(not supported on the layer's transport; working with the how-to's Flower-only app)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from celery.result import AsyncResult
from kombu import Connection, Producer

from conventions import bind
from conventions.capacity.locks import mutex
from tests.acceptance import support_lifecycle as lifecycle
from tests.fixtures import ROOT
from tests.integration import support_metrics
from tests.integration.helpers import Events, dead_letter_of, publish_foreign, wait_for
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("clean_store")

CREDENTIALS = "ops:s3cret"
#: the how-to's column list (docs/howto/flower.md)
COLUMNS = "name,uuid,state,kwargs,result,exception,retries,received,started,runtime,worker"
#: the how-to's Flower-only app (docs/howto/flower.md, "The Broker page")
FLOWER_APP = '''\
"""Flower's own copy of the app: kombu's stock Redis transport, which Flower can read."""
from tasks import app

app.conf.broker_transport = None
'''
Flower = Callable[..., str]


@pytest.fixture
def flower(services: None, tmp_path: Path) -> Iterator[Flower]:
    """Start a real Flower: ``flower("--tasks_columns=...", app="tasks")``; its URL."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*options: str, app: str = "tasks") -> str:
        port = free_port()
        (tmp_path / "flowerapp.py").write_text(FLOWER_APP)
        pythonpath = os.pathsep.join([str(ROOT), str(tmp_path)])
        argv = [sys.executable, "-m", "celery", "-A", app, "flower", f"--port={port}",
                "--address=127.0.0.1", f"--basic-auth={CREDENTIALS}", *options]  # fmt: skip
        with (tmp_path / f"flower-{port}.log").open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": pythonpath},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(f"{url}/healthcheck")[0] == 200, timeout=60, every=0.3)
        return url

    yield start
    for proc in started:
        proc.terminate()
    for proc in started:
        proc.wait(20)


def _get(url: str) -> tuple[int | None, str]:
    request = urllib.request.Request(url)
    token = base64.b64encode(CREDENTIALS.encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None, ""


def _post(url: str, body: bytes) -> int | None:
    request = urllib.request.Request(url, data=body, method="POST")
    token = base64.b64encode(CREDENTIALS.encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _api(url: str) -> Any:
    status, body = _get(url)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


def _task(url: str, task_id: str, state: str) -> dict[str, Any] | None:
    task = _api(f"{url}/api/tasks").get(task_id)
    return task if task and task.get("state") == state else None


def _workers(url: str) -> dict[str, Any] | None:
    return dict(_api(f"{url}/api/workers?refresh=1")) or None


def _warm_up(url: str) -> None:
    """Flower answers before its event consumer is connected: wait until it saw a job."""
    handle = support_metrics.metered.delay(item_id="flower_warm_up")
    wait_for(lambda: _task(url, handle.id, "SUCCESS"), timeout=30, every=0.5)


def test_a_retried_job_keeps_its_correlation_id_in_the_kwargs_flower_shows(
    flower: Flower, worker_process: Callable[..., Any]
) -> None:
    url = flower(f"--tasks_columns={COLUMNS}")
    worker_process("flower-retry", "email", include="tests.integration.support_metrics")
    with Events() as events:
        _warm_up(url)
        wait_for(lambda: events.seen, timeout=30, every=0.2)
        with bind(correlation_id="corr-flower-retry"):
            handle = support_metrics.metered.delay(item_id="flower_retried", fails=1)
        assert handle.get(timeout=30) == "ok"
        wait_for(lambda: events.of(handle.id, "task-succeeded"), timeout=30, every=0.2)
        sent, received = events.of(handle.id, "task-sent"), events.of(handle.id, "task-received")
    assert len(received) == 2  # the first attempt and its retry
    assert [e["retries"] for e in received] == [0, 1]
    for event in sent + received:
        assert "'~correlation': 'corr-flower-retry'" in event["kwargs"], event
        assert "'item_id': 'flower_retried'" in event["kwargs"]
    task = wait_for(lambda: _task(url, handle.id, "SUCCESS"), timeout=30, every=0.5)
    assert task["retries"] == 1
    assert "'~correlation': 'corr-flower-retry'" in task["kwargs"]
    for query in ("corr-flower-retry", "kwargs:~correlation=corr-flower-retry"):  # the how-to's
        found = _api(f"{url}/api/tasks?search={urllib.parse.quote(query)}")
        assert list(found) == [handle.id], query
    status, page = _get(f"{url}/tasks")
    assert status == 200
    assert '<th data-column="kwargs">kwargs</th>' in page  # the how-to's columns


def test_a_deferred_job_is_received_with_its_correlation_id_in_its_kwargs(
    worker_process: Callable[..., Any],
) -> None:
    """An exclusive job whose lock is held is published again for later (a deferral):
    its next delivery's kwargs, the ones Flower's task row shows, still name the story."""
    from tasks import app

    worker_process("flower-defer", "email", include="tests.acceptance.support_lifecycle")
    with Events() as events:
        warm_up = lifecycle.one_per_customer.delay(customer_id="cus_w", call_id="flower_w")
        assert warm_up.get(timeout=30) == "flower_w"
        wait_for(lambda: events.of(warm_up.id, "task-succeeded"), timeout=30, every=0.2)
        with mutex(app.store, "customer:cus_f", ttl=10):
            with bind(correlation_id="corr-flower-defer"):
                handle = lifecycle.one_per_customer.delay(customer_id="cus_f", call_id="flower_d")
            wait_for(lambda: len(events.of(handle.id, "task-received")) >= 2 or None, timeout=30)
        assert handle.get(timeout=30) == "flower_d"
        received = events.of(handle.id, "task-received")
    for event in received:
        assert "'~correlation': 'corr-flower-defer'" in event["kwargs"], event


def test_the_how_to_and_compose_run_flower_with_the_columns_and_the_app_tested_here() -> None:
    howto = (ROOT / "docs" / "howto" / "flower.md").read_text()
    compose = (ROOT / "docker" / "compose.yaml").read_text()
    assert howto.count(f"--tasks_columns={COLUMNS}") >= 2
    assert f"--tasks_columns={COLUMNS}" in compose
    for line in FLOWER_APP.splitlines():
        assert line in howto, line
    assert "celery -A flowerapp flower --port=5555 --read_only=True" in howto


def test_flowers_default_columns_leave_the_kwargs_out(flower: Flower) -> None:
    """Why the how-to names ``--tasks_columns``: without it the correlation id is not on
    the task list (the task page and the search still have it)."""
    status, page = _get(f"{flower()}/tasks")
    assert status == 200
    assert 'data-column="name"' in page
    assert 'data-column="kwargs"' not in page


def test_a_dead_letters_category_and_id_are_in_the_traceback_flower_and_the_result_show(
    flower: Flower, worker_process: Callable[..., Any]
) -> None:
    from tasks import app

    url = flower()
    worker_process("flower-dead", "email", include="tests.integration.support_metrics")
    _warm_up(url)
    handle = support_metrics.metered.delay(item_id="flower_dead", mode="permanent")
    with pytest.raises(Exception, match="flower_dead is refused for good"):
        handle.get(timeout=30)
    record = wait_for(lambda: dead_letter_of(handle.id), timeout=10)
    note = f"dead-lettered as permanent ({record.id}): conventions dlq show {record.id}"
    assert note in str(handle.traceback)
    task = wait_for(lambda: _task(url, handle.id, "FAILURE"), timeout=30, every=0.5)
    assert note in task["traceback"]
    info = _api(f"{url}/api/task/info/{handle.id}")
    assert note in info["traceback"]
    # a message the worker rejects (its payload fails validation): the FAILURE it stores
    with Connection(str(app.conf.broker_url)) as conn:
        rejected = publish_foreign(Producer(conn), "testing.metered.v1", {}, "email")
    invalid = wait_for(lambda: dead_letter_of(rejected), timeout=30)
    result: AsyncResult[Any] = AsyncResult(rejected, app=app)
    wait_for(lambda: result.state == "FAILURE" or None, timeout=10)
    # Celery stores the Reject as the FAILURE (result: its reason, no traceback); the
    # task-failed event's traceback has the refused payload's error as its cause, noted
    failed = wait_for(lambda: _task(url, rejected, "FAILURE"), timeout=30, every=0.5)
    assert f"dead-lettered as invalid ({invalid.id})" in failed["traceback"]


def test_the_broker_page_is_refused_on_the_layers_transport_and_works_with_flowers_own_app(
    flower: Flower, worker_process: Callable[..., Any], broker_redis: Any, tmp_path: Path
) -> None:
    layer = flower()
    stock = flower("--read_only=True", f"--tasks_columns={COLUMNS}", app="flowerapp")
    worker = worker_process("flower-broker", "email", include="tests.integration.support_metrics")
    for url in (layer, stock):  # each Flower asks the worker for its queues
        wait_for(partial(_workers, url), timeout=30)
    assert _get(f"{layer}/broker")[0] == 404
    assert _get(f"{layer}/api/queues/length")[0] == 404
    port = layer.rsplit(":", 1)[1]
    said = (tmp_path / f"flower-{port}.log").read_text(errors="replace")
    assert "'redis' broker is not supported" in said  # the reason, in Flower's log
    worker.stop()
    ids = [support_metrics.metered.delay(item_id=f"flower_wait_{n}").id for n in range(3)]
    try:
        queues = _api(f"{stock}/api/queues/length")["active_queues"]
        assert {"name": "email", "messages": 3} in queues
        status, page = _get(f"{stock}/broker")
        assert status == 200
        assert "email" in page
        # read-only: it never publishes through the stock transport
        assert _post(f"{stock}/api/task/async-apply/testing.metered.v1", b"{}") == 403
    finally:
        broker_redis.delete("email")
        assert len(ids) == 3
