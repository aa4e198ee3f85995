"""The refusal path of a mixed fleet: HEAD publishes with a newer header format than the
previous release reads, a worker of that release dead-letters every such job with the
reason and runs none, and once the fleet is new a HEAD worker replays each one, once;
on a Redis broker and on a RabbitMQ one (the store on Redis).

The newer format is played in the test's own processes (the HEAD publisher, the HEAD
worker and the replaying process set ``conventions.config.formats.HEADERS`` one above
the release's before anything else runs), never by a knob in the layer. This is the test
that shows the mixed-fleet runs can fail: bump a format on the HEAD side without the old
readers refusing it, and the old worker runs what it would misread.

Against a release from before the format checks (#34; the stand-in commit ``d4826b0``
before ``v0.1.0`` was tagged) this test fails: the old worker runs all six jobs.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from conventions.store import open_store
from tests.acceptance import rabbit_node
from tests.acceptance.releases import PREVIOUS
from tests.acceptance.support_chaos import (
    APPLIED,
    DUPLICATED,
    RedisServer,
    Worker,
    own_redis,
    scalar,
    shop_database,
)
from tests.acceptance.support_fleet import PROJECT, QUEUE, Servers
from tests.acceptance.support_release import HEAD, Runtime, release_runtime
from tests.fixtures import unavailable

pytestmark = pytest.mark.chaos

JOBS = 6
#: runs first in a HEAD process of the test: this process plays the next release
NEWER = "from conventions.config import formats; formats.HEADERS += 1; "
#: a HEAD ``celery`` whose processes read and write the newer format (the pool's
#: processes are forked from it and inherit it)
NEWER_CELERY = NEWER + "import sys; from celery.__main__ import main; sys.exit(main())"
PUBLISH = (
    NEWER
    + """
import runpy, sys
sys.argv = ["publish", *sys.argv[1:]]
runpy.run_module("tasks.publish", run_name="__main__")
"""
)
REPLAY = (
    NEWER
    + """
import sys
from conventions.ops.replay import replay
from tasks import app
for record_id in sys.argv[1:]:
    print(replay(app, record_id, reason="the fleet is new", actor="test").id)
"""
)


@pytest.fixture
def chaos_redis(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    with own_redis(folder) as server:
        yield server


@pytest.fixture(params=["redis", "rabbitmq"])
def servers(
    request: pytest.FixtureRequest, chaos_redis: RedisServer, tmp_path: Path
) -> Iterator[Servers]:
    """The broker (a Redis or a RabbitMQ node of the test's own), the store on Redis."""
    with contextlib.ExitStack() as stack:
        broker = chaos_redis.url(0)
        if request.param == "rabbitmq":
            if not rabbit_node.installed():
                unavailable("rabbitmq-server (a node of the test's own)", FileNotFoundError())
            (tmp_path / "rabbit").mkdir()
            broker = stack.enter_context(rabbit_node.private_node(tmp_path / "rabbit")).url
        engine = stack.enter_context(shop_database(JOBS))
        yield Servers(broker, chaos_redis.url(1), engine)


def _head(code: str, servers: Servers, *args: str) -> str:
    done = subprocess.run(
        [str(HEAD.python), "-c", code, *args], cwd=PROJECT, env=servers.env("new"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _worker(name: str, launcher: list[str], servers: Servers, kind: str, folder: Path) -> Worker:
    return Worker(
        "tasks", name, QUEUE, servers.env(kind), folder, launcher=launcher, cwd=PROJECT
    ).wait_ready()


def _dead_letters(servers: Servers, count: int, timeout: float = 90) -> list[object]:
    """The store's dead letters once there are ``count`` (or every job ran instead)."""
    store = open_store(servers.store_url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = store.list_dead_letters(limit=100)
            if len(found) >= count or scalar(servers.engine, APPLIED) >= count:
                return list(found)
            time.sleep(0.3)
        return list(store.list_dead_letters(limit=100))
    finally:
        store.close()


def _wait_applied(engine: Engine, count: int, timeout: float = 90) -> int:
    deadline = time.monotonic() + timeout
    while scalar(engine, APPLIED) < count and time.monotonic() < deadline:
        time.sleep(0.3)
    return scalar(engine, APPLIED)


@pytest.mark.timeout(300)
def test_an_old_worker_dead_letters_a_newer_format_unrun_and_a_new_worker_replays_it_once(
    servers: Servers, tmp_path: Path
) -> None:
    old: Runtime = release_runtime(PREVIOUS)
    folder = tmp_path / "workers"
    folder.mkdir()
    worker = _worker("old-1", old.celery, servers, "old", folder)
    try:
        # HEAD, playing the next release, publishes every event through the old fleet
        for parity in ("odd", "even"):
            _head(PUBLISH, servers, parity, str(JOBS), "0")
        records = _dead_letters(servers, JOBS)
        ran = scalar(servers.engine, APPLIED)
    finally:
        worker.terminate()
    assert ran == 0, f"the old worker ran {ran} jobs of a newer format:\n{worker.output()}"
    assert len(records) == JOBS, worker.output()[-3000:]
    for record in records:
        category = getattr(record, "category", None)
        assert getattr(category, "value", category) == "newer_format", record
        message = str(getattr(record, "message", ""))
        assert "version 2" in message and "reads up to 1" in message, message
    # the fleet is new: a HEAD worker that reads the newer format replays each one, once
    new = _worker("new-1", [str(HEAD.python), "-c", NEWER_CELERY], servers, "new", folder)
    try:
        replayed = _head(REPLAY, servers, *[str(getattr(r, "id", "")) for r in records])
        assert len(replayed.split()) == JOBS, replayed
        applied = _wait_applied(servers.engine, JOBS)
    finally:
        new.terminate()
    assert applied == JOBS, new.output()[-3000:]
    assert scalar(servers.engine, DUPLICATED) == 0
