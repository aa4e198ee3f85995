"""The layer on a real Redis Sentinel group (one primary, one replica, three sentinels,
started here): jobs run through it, a failover keeps every acknowledged job and runs
it once, the worker, the publisher and the store follow the new primary, and the
one-trip publish is one trip on the current primary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue
from sqlalchemy import Engine, text

from conventions.config.sentinel import Replicated
from conventions.errors import BackendUnavailable
from conventions.store.redis import RedisStore
from conventions.transport import publish as onetrip
from conventions.transport.redis import SentinelChannel
from tests.acceptance.support_chaos import APPLIED, DUPLICATED, ROOT, Worker, scalar, shop_database
from tests.integration import support_sentinel as group_support
from tests.integration.support_sentinel import MASTER, Group, broker_url, store_url

TRANSPORT = "conventions.transport.redis:Transport"


@pytest.fixture(scope="module")
def group() -> Iterator[Group]:
    with group_support.sentinel_group() as started:
        yield started


@pytest.fixture
def shop(group: Group) -> Iterator[Engine]:
    with shop_database(orders=200) as engine:
        yield engine


def env_for(engine: Engine, broker_db: int, store_db: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "CONVENTIONS_"))}
    env |= {
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": f"redis://127.0.0.1:{group_support.PORTS[0]}/{broker_db}",
        "DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "CONVENTIONS_LEASE_SECONDS": "3",
        "CONVENTIONS_RECOVERY_TIMEOUT": "6",
        "SENTINEL_BROKER_DB": str(broker_db),
        "SENTINEL_STORE_DB": str(store_db),
    }
    return env


def publish(
    env: dict[str, str], count: int, patience: float = 30, hold: int = 0, go: Path | None = None
) -> subprocess.Popen[bytes]:
    """The publisher process (``support_sentinel.publish_main``); with ``hold`` and
    ``go``, it waits after ``hold`` jobs until the file ``go`` exists."""
    held = [str(hold), str(go)] if go is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.support_sentinel", str(count), str(patience),
         *held],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def until_applied(
    engine: Engine, publisher: subprocess.Popen[bytes], wanted: int, timeout: float = 120
) -> None:
    """Until ``wanted`` jobs took effect, the publisher (held) still running."""
    deadline = time.monotonic() + timeout
    while scalar(engine, APPLIED) < wanted:
        assert publisher.poll() is None, publisher.communicate()[0].decode(errors="replace")
        assert time.monotonic() < deadline, f"{scalar(engine, APPLIED)} of {wanted} applied"
        time.sleep(0.02)


def stop(publisher: subprocess.Popen[bytes]) -> None:
    """The publisher ended and its pipe closed, whatever happened."""
    if publisher.poll() is None:
        publisher.kill()
    publisher.wait(10)
    if publisher.stdout is not None:
        publisher.stdout.close()


def published(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return answer


def applied_events(engine: Engine) -> set[str]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT id FROM payment_events WHERE applied_at IS NOT NULL")
        ).scalars()
        return set(rows)


def wait_applied(engine: Engine, wanted: set[str], timeout: float = 90) -> set[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = applied_events(engine)
        if wanted <= done:
            return done
        time.sleep(0.2)
    return applied_events(engine)


def test_a_job_published_through_sentinel_runs_on_a_worker(
    group: Group, shop: Engine, tmp_path: Path
) -> None:
    env = env_for(shop, 3, 4)
    worker = Worker("tests.integration.support_sentinel", "s1", "email", env, tmp_path)
    try:
        worker.wait_ready()
        with Monitor(group.primary()) as monitor:
            answer = published(publish(env, 5))
            assert answer["acknowledged"] == [f"evt_{n:04d}" for n in range(1, 6)]
            done = wait_applied(shop, set(answer["acknowledged"]), timeout=30)
        assert set(answer["acknowledged"]) <= done, worker.output()[-3000:]
        # the result writes ride the store's claim and completion (SentinelBackend): no
        # result key is written by a command of its own
        written = [(line.get("client_type"), line["command"]) for line in monitor.lines]
        results = [command for kind, command in written
                   if kind != "lua" and "celery-task-meta" in command
                   and command.split()[0].strip('"').upper() in ("SET", "SETEX")]  # fmt: skip
        assert not results, results[:3]
        # one trip per publish: the reservation script with the push inside, and its WAIT
        sent = monitor.sent(3)
        assert "LPUSH" not in sent, sent
        assert sent.count("EVALSHA") >= 5 and sent.count("WAIT") >= 5, sent
    finally:
        worker.terminate(timeout=20)


@pytest.mark.chaos  # a failover takes seconds: `make chaos`, with the 2,000-job run
def test_a_failover_during_a_run_keeps_every_acknowledged_job_once(
    group: Group, shop: Engine, tmp_path: Path
) -> None:
    env = env_for(shop, 5, 6)
    workers = [Worker("tests.integration.support_sentinel", f"f{n}", "email", env, tmp_path)
               for n in (1, 2)]  # fmt: skip
    publisher: subprocess.Popen[bytes] | None = None
    try:
        for worker in workers:
            worker.wait_ready()
        # the publisher stops after 100 jobs until the failover is asked for: the other
        # 100 go out through it, however fast the workers are
        publisher = publish(env, 200, hold=100, go=tmp_path / "go")
        until_applied(shop, publisher, 30)
        old, _ = group.failover()
        (tmp_path / "go").touch()
        new = group.wait_new_primary(old)
        answer = published(publisher)
        acknowledged = set(answer["acknowledged"])
        assert len(acknowledged) == 200, answer  # every job went out, after its refusals
        done = wait_applied(shop, acknowledged)
        logs = "\n".join(w.output()[-2000:] for w in workers)
        assert acknowledged <= done, f"lost {sorted(acknowledged - done)[:10]}\n{logs}"
        assert scalar(shop, DUPLICATED) == 0
        assert group.primary() == new
        # the workers follow the new primary: a job published now runs
        assert all(worker.alive() for worker in workers), logs
    finally:
        if publisher is not None:
            stop(publisher)
        for worker in workers:
            worker.terminate(timeout=20)


@pytest.mark.chaos  # a failover takes seconds: `make chaos`, with the 2,000-job run
def test_the_publisher_and_the_store_follow_the_new_primary(group: Group) -> None:
    store = RedisStore(store_url(7, min_replicas=1))
    connection = Connection(
        broker_url(8), transport=TRANSPORT,
        transport_options={"master_name": MASTER, "min_replicas": 1, "replica_wait_ms": 1000},
    )  # fmt: skip
    queue = Queue("follow", Exchange("follow", "direct"), "follow")
    try:
        channel = connection.default_channel
        assert isinstance(channel, SentinelChannel)
        producer = connection.Producer()
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="follow", declare=[queue])
        assert store.reserve("before", "job-1", 60) is None
        old, _ = group.failover()
        new = group.wait_new_primary(old)
        group.wait_replicated()
        _eventually(lambda: producer.publish(
            {"n": 2}, exchange=queue.exchange, routing_key="follow", retry=True,
            retry_policy={"max_retries": 2},
        ))  # fmt: skip
        assert _eventually(lambda: store.reserve("after", "job-2", 60)) is None
        holder = store.reserve("before", "job-3", 60)  # kept across the failover
        assert holder == "job-1"
        with redis.Redis(port=new, db=8) as primary:
            assert primary.llen("follow") == 2
    finally:
        store.close()
        connection.release()


def _eventually(call: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except (BackendUnavailable, redis.ConnectionError, redis.ReadOnlyError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_publish_not_on_a_replica_in_time_raises(group: Group) -> None:
    """``min_replicas`` above the replicas there are: the write stays on the primary,
    and the caller hears that a failover could lose it."""
    client = Replicated.from_url(f"redis://127.0.0.1:{group.primary()}/9").guard(2, 50, "broker")
    try:
        with pytest.raises(BackendUnavailable, match="1 of 2 replica"):
            client.lpush("unconfirmed", "x")
        assert client.llen("unconfirmed") == 1
    finally:
        client.delete("unconfirmed")
        client.close()


def test_a_sentinel_broker_and_store_of_one_group_publish_in_one_trip(group: Group) -> None:
    from celery import Celery

    publisher = Celery("sentinel-onetrip")
    publisher.conf.update(
        broker_url=broker_url(10), broker_transport=TRANSPORT,
        broker_transport_options={"master_name": MASTER},
    )  # fmt: skip
    store = RedisStore(store_url(11))
    other_group = RedisStore(store_url(11).replace(f"master_name={MASTER}", "master_name=other"))
    fixed = RedisStore(f"redis://127.0.0.1:{group.primary()}/11")
    try:
        assert onetrip.eligible(publisher, store)
        assert not onetrip._same_server(publisher.conf, other_group)
        assert not onetrip._same_server(publisher.conf, fixed)  # a server, not the group
    finally:
        for each in (store, other_group, fixed):
            each.close()
        publisher.close()


class Monitor:
    """The commands clients send to one server while the block runs (``MONITOR``)."""

    def __init__(self, port: int) -> None:
        self.client = redis.Redis(port=port, decode_responses=True)
        self.lines: list[dict[str, Any]] = []

    def __enter__(self) -> Monitor:
        import threading

        self._monitor = self.client.monitor()
        connection = self._monitor.__enter__()

        def read() -> None:
            try:
                for line in connection.listen():
                    self.lines.append(line)
            except (redis.ConnectionError, ValueError):
                return

        threading.Thread(target=read, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        time.sleep(0.3)
        self._monitor.connection.disconnect()
        self.client.close()

    def sent(self, db: int) -> list[str]:
        return [line["command"].split()[0].strip('"').upper() for line in self.lines
                if line.get("client_type") != "lua" and line.get("db") == db]  # fmt: skip


@pytest.mark.chaos  # a failover takes seconds: `make chaos`, with the 2,000-job run
def test_a_new_primarys_clock_does_not_make_a_live_consumer_look_dead(group: Group) -> None:
    """After a failover a keeper that reconnected without an error (redis-py retries a
    dropped connection by itself) holds its sweep for one beat period: a live consumer
    whose score looks lapsed on the new primary (a clock ahead of the old one, here set
    back by hand) renews in that time instead of having its inbox given back. A plain
    keeper, which does not follow the primary, gives it back at once."""
    from conventions.config.sentinel import broker_client
    from conventions.transport import liveness
    from conventions.transport.layout import CONSUMERS, INBOX, INBOXES
    from conventions.transport.sentinel import FollowingKeeper

    client = broker_client(broker_url(12), {"master_name": MASTER})
    inbox = INBOX.format(consumer="live", source="jobs")

    def keeper(kind: type[liveness.Keeper], name: str) -> liveness.Keeper:
        return kind(
            name, client=lambda: client, queues=list, inboxes=dict, restore=lambda: None,
            unacked_index="unacked_index", recovery_timeout=30.0, mover_interval=1.0,
        )  # fmt: skip

    def lapsed_consumer() -> None:
        """The live consumer as the new primary sees it: its score in the past."""
        client.zadd(CONSUMERS, {"live": 1.0})
        client.hset(INBOXES, inbox, "jobs")
        client.delete(inbox, "jobs")
        client.lpush(inbox, "a job it fetched")

    following, plain = keeper(FollowingKeeper, "sweeper"), keeper(liveness.Keeper, "naive")
    try:
        following.beat()
        old, _ = group.failover()
        new = group.wait_new_primary(old)
        group.wait_replicated()  # the old primary demoted: its clients were dropped
        _eventually(lambda: client.set("writable", 1))
        assert client.connection_pool.get_master_address()[1] == new
        lapsed_consumer()
        following.beat()  # the first beat on the new primary: it sees the change
        assert following.failovers == 1
        assert following.sweep() == 0
        assert client.llen(inbox) == 1  # held for a period: the consumer may renew
        assert plain.sweep() == 1  # without the hold, a live consumer's job moves
        assert client.llen("jobs") == 1
    finally:
        client.delete(CONSUMERS, INBOXES, inbox, "jobs", "writable")
        client.close()


def test_the_queues_view_and_the_doctor_read_the_groups_primary(group: Group) -> None:
    """``conventions queues`` (the view and the CLI) and the doctor's server checks on a
    ``sentinel://`` broker: the group's current primary, not the first sentinel's port."""
    from conventions import App
    from conventions.cli import main as cli
    from conventions.observability import queues
    from conventions.ops import doctor

    app = App("sentinel_readers", set_as_current=False)
    app.conf.update(group_support.sentinel_conf(broker_db=9, store_db=10))
    app.conf.update(conventions_workloads={"view": "ccs_view"}, task_default_queue="ccs_view")
    with redis.Redis(port=group.primary(), db=9) as primary:
        primary.delete("ccs_view")
        primary.lpush("ccs_view", b"{}", b"{}")
        with queues.from_app(app) as reader:
            states = {state.queue: state for state in reader.read()}
        assert states["ccs_view"].depth == 2
        found = doctor.static_checks(app, server=True)  # the primary's INFO and CONFIG read
        assert not [f for f in found if f.code.startswith("redis-")], found
        primary.delete("ccs_view")
    group_support.readers_app = app
    try:
        code = cli.main(["-A", f"{group_support.__name__}:readers_app", "queues", "--json"])
    finally:
        del group_support.readers_app
    assert code == 0
