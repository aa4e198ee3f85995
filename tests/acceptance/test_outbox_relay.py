"""The outbox end to end: real PostgreSQL, real Redis, real relay and worker processes.

* a web process killed right after its commit: the relay still publishes its job;
* the broker stopped for 30 s while orders keep coming: every job is published once and
  runs once after it returns (the broker is a Redis server of this test's own);
* two relays on 5,000 rows: every row is published exactly once (the broker's queue holds
  each row's task id once).

Order ids used here (no other test touches them): ``ord_kill_*``, ``ord_out_*``,
``ord_two_*``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
import redis
import sqlalchemy as sa

from conventions import bind
from conventions.transactional import outbox
from tasks import app, db
from tasks.receipts import send_receipt
from tests.fixtures import WorkerProcess, unavailable
from tests.integration import support_outbox as ob
from tests.integration.helpers import SpareRedis, wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

StartWorker = Callable[..., WorkerProcess]
QUEUE = "email"
#: the outage: how long the broker is down, and orders placed before/after it
OUTAGE_SECONDS = 30.0
AROUND_OUTAGE_SECONDS = 3.0
ORDER_EVERY_SECONDS = 0.25
TWO_RELAYS_ROWS = 5000
#: what the relay logs for each batch it published
PUBLISHED = re.compile(r"outbox: published (\d+) \((\d+) deduplicated\)")


class RelayProcess:
    """``conventions outbox relay`` (long-running) as a subprocess, logging to a file."""

    def __init__(self, log: Path, env: dict[str, str], *args: str) -> None:
        self.log = log
        self._out: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conventions", "-A", "tasks", "outbox", "relay", *args],
            cwd=ob.ROOT,
            env={**os.environ, "PYTHONPATH": str(ob.ROOT), **env},
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def published(self) -> int:
        return sum(int(n) for n, _ in PUBLISHED.findall(self.output()))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()
        return int(self.proc.returncode)


@pytest.fixture
def engine(services: None, broker_redis: redis.Redis) -> Iterator[sa.Engine]:
    engine = ob.reset_outbox()
    broker_redis.delete(QUEUE)
    yield engine
    broker_redis.delete(QUEUE)


def _succeeded_per_task(correlation_id: str) -> Counter[str]:
    return Counter(e.task_id for e in app.store.audit_for(correlation_id) if e.event == "succeeded")


def test_a_web_process_killed_right_after_its_commit_still_gets_its_job_published(
    engine: sa.Engine, worker_process: StartWorker, tmp_path: Path
) -> None:
    web = subprocess.run(
        [sys.executable, "-m", "tests.acceptance.support_outbox_web", "ord_kill_1"],
        cwd=ob.ROOT,
        env={**os.environ, "PYTHONPATH": str(ob.ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert web.returncode == -signal.SIGKILL, web.stderr
    task_id = web.stdout.strip()
    (row,) = ob.rows(engine)
    assert (row.task_id, row.published_at) == (task_id, None)

    worker_process("ob_kill", QUEUE)
    relay = RelayProcess(tmp_path / "relay.log", {}, "--poll", "0.2")
    try:
        wait_for(lambda: ob.receipts_sent("ord_kill_1")["ord_kill_1"] == 1, timeout=60)
    finally:
        assert relay.stop() == 0, relay.output()
    assert relay.published() == 1
    assert _succeeded_per_task("corr-ord_kill_1") == Counter({task_id: 1})


class OwnBroker(SpareRedis):
    """A Redis server of this test's own as the broker, with an append-only file: a
    graceful stop and a restart keep its queues, as a production broker's would."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port)
        wait_for(lambda: _pings(client), timeout=10, every=0.05)
        client.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    if shutil.which("redis-server") is None:
        unavailable("redis-server (the outage test starts a broker of its own to stop)",
                    FileNotFoundError("redis-server"))  # fmt: skip
    broker = OwnBroker(tmp_path)
    broker.start()
    yield broker
    broker.stop()


def _place_orders(stop: threading.Event, placed: list[str], lags: list[float]) -> None:
    """The web app: one order (and its receipt job, through the outbox) every 0.25 s."""
    while not stop.is_set():
        order_id = f"ord_out_{len(placed) + 1:04d}"
        with bind(correlation_id="corr-outage"), db.transaction() as session:
            ob.new_order(session, order_id)
            outbox.add(session, send_receipt, order_id=order_id)
        placed.append(order_id)
        lags.append(outbox.lag(db.engine()))
        stop.wait(ORDER_EVERY_SECONDS)


def _wait_for_receipts(placed: list[str], engine: sa.Engine, broker: OwnBroker) -> None:
    """Wait until every order got its receipt; else fail saying where the jobs are."""
    try:
        wait_for(lambda: all(ob.receipts_sent(*placed).values()), timeout=120, every=0.5)
    except AssertionError:
        missing = [order for order, n in ob.receipts_sent(*placed).items() if not n]
        client = redis.Redis(port=broker.port)
        where = {
            "missing": missing,
            "unpublished": [r.kwargs["order_id"] for r in ob.rows(engine, published_at=None)],
            "queued": client.llen(QUEUE),
            "unacked": client.hlen("unacked"),
        }
        client.close()
        raise AssertionError(f"jobs without a receipt: {where}") from None
    assert outbox.status(engine).pending == 0


@pytest.mark.chaos
def test_jobs_added_while_the_broker_is_down_are_published_once_and_run_once(
    engine: sa.Engine, own_broker: OwnBroker, worker_process: StartWorker, tmp_path: Path
) -> None:
    env = {
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{own_broker.port}/0",
        # a job the worker held when the broker went away stays in kombu's unacked set;
        # the worker's sweep at reconnect puts it back once it is older than this
        "CONVENTIONS_VISIBILITY_TIMEOUT": "10",
    }
    worker = worker_process("ob_outage", QUEUE, **env)
    relay = RelayProcess(tmp_path / "relay.log", env, "--poll", "0.2", "--max-backoff", "2")
    placed: list[str] = []
    lags: list[float] = []
    stop = threading.Event()
    web = threading.Thread(target=_place_orders, args=(stop, placed, lags))
    web.start()
    try:
        time.sleep(AROUND_OUTAGE_SECONDS)
        own_broker.stop()
        time.sleep(OUTAGE_SECONDS)
        own_broker.start()
        time.sleep(AROUND_OUTAGE_SECONDS)
    finally:
        stop.set()
        web.join(30)
    if worker.proc.poll() is not None:
        # kombu 5.7: a worker that holds an unacked message when the broker goes away can
        # die on reconnect ("Unrecoverable error: AttributeError ... 'hostname'"); a
        # supervisor (compose: restart: unless-stopped) starts it again, and so does this
        worker_process("ob_outage_restarted", QUEUE, **env)

    try:
        _wait_for_receipts(placed, engine, own_broker)
    finally:
        relay_exit = relay.stop()
    log = relay.output()
    assert relay_exit == 0, log
    assert "broker unavailable" in log  # the relay did meet the outage
    assert max(lags) > OUTAGE_SECONDS / 2  # and the outbox lag showed it
    assert len(placed) > OUTAGE_SECONDS / ORDER_EVERY_SECONDS
    assert set(ob.receipts_sent(*placed).values()) == {1}  # each job ran once
    assert relay.published() == len(placed)  # each row was published once
    succeeded = _succeeded_per_task("corr-outage")  # the ledger's view: one run per job
    assert len(succeeded) == len(placed) and set(succeeded.values()) == {1}


def test_two_relays_on_five_thousand_rows_publish_each_row_exactly_once(
    engine: sa.Engine, broker_redis: redis.Redis, tmp_path: Path
) -> None:
    rows = [
        outbox.row_for(send_receipt, {"order_id": f"ord_two_{n:05d}"})
        for n in range(TWO_RELAYS_ROWS)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(outbox.table), rows)

    relays = [
        RelayProcess(tmp_path / f"relay{n}.log", {}, "--once", "--batch", "100") for n in (1, 2)
    ]
    for relay in relays:
        relay.proc.wait(150)
    exits = [relay.stop() for relay in relays]

    assert exits == [0, 0], [relay.output() for relay in relays]
    counts = [relay.published() for relay in relays]
    assert sum(counts) == TWO_RELAYS_ROWS and min(counts) > 0, counts  # both did work
    queued = Counter(json.loads(raw)["headers"]["id"] for raw in broker_redis.lrange(QUEUE, 0, -1))
    assert set(queued.values()) == {1}  # no task id twice
    assert set(queued) == {row["task_id"] for row in rows}  # no row skipped
    assert outbox.status(engine).pending == 0
