"""Fixtures for tests against real services and real workers (a pytest plugin)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis

from tests import isolation
from tests.conftest import BROKER_DB, OWN_REDIS, OWN_VHOST, PG_BASE, REDIS_BASE, SHOP_DB, STORE_DB

ROOT = Path(__file__).resolve().parents[1]


#: how a missing service gets started: ``make test`` runs it first
START_SERVICES = (
    "make services (scripts/services.sh) starts Redis, PostgreSQL and RabbitMQ when they "
    "are installed: apt-get install redis-server postgresql rabbitmq-server"
)
#: the Debian packages of the system tools some tests run (scripts/test-deps.sh, which
#: ``make test`` runs, installs the missing ones as root on a machine with apt-get)
TOOL_PACKAGES = {
    "chromium": "chromium chromium-driver",
    "promtool": "prometheus",
    "faketime": "faketime",
    "docker-compose": "docker-compose",
}


def unavailable(what: str, exc: BaseException) -> NoReturn:
    """Skip on a laptop without the service; fail in CI, where it must be there."""
    _skip_or_fail(f"{what} is not reachable ({exc}); start it: {START_SERVICES}")


def missing_tool(tool: str) -> str:
    """Why a test of ``tool`` cannot run, saying how to install it."""
    packages = TOOL_PACKAGES[tool]
    return (
        f"{tool} is not installed: sudo apt-get install --no-install-recommends {packages} "
        "(make test runs scripts/test-deps.sh, which installs it when run as root with apt-get)"
    )


def tool_unavailable(tool: str) -> NoReturn:
    """Skip on a laptop without the system tool; fail in CI, where it must be there."""
    _skip_or_fail(missing_tool(tool))


def _skip_or_fail(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session", autouse=True)
def worker_servers() -> Iterator[None]:
    """This test worker's own servers (:mod:`tests.isolation`): its ``redis-server``
    and its RabbitMQ vhost, made before its first test and gone after its last. Where
    the tool is missing (a laptop without redis-server or rabbitmqctl) nothing starts,
    and the tests that need the server skip or fail as they do without one."""
    own = isolation.OwnRedis() if OWN_REDIS and shutil.which("redis-server") else None
    if own is not None:
        own.start()
    vhost = OWN_VHOST and isolation.rabbitmqctl() is not None
    if vhost:
        try:
            isolation.fresh_vhost()
        except (RuntimeError, subprocess.TimeoutExpired):
            if os.environ.get("CI"):
                raise
            vhost = False  # no RabbitMQ answers here: its tests skip on their own
    try:
        yield
    finally:
        if vhost:
            isolation.drop_vhost()
        if own is not None:
            own.stop()


def _own_redis_db(db: int) -> Iterator[redis.Redis]:
    """A Redis database of this run's own, emptied before and after."""
    client = redis.Redis.from_url(f"{REDIS_BASE}/{db}", decode_responses=True)
    try:
        client.ping()
    except redis.ResponseError as exc:
        client.close()
        if "out of range" not in str(exc):
            raise
        # a server with fewer databases than the number asked for: not a missing service
        pytest.fail(
            f"Redis database {db} does not exist on {REDIS_BASE} ({exc}): choose another "
            "TEST_BROKER_DB / TEST_STORE_DB, or start redis-server with more --databases"
        )
    except redis.RedisError as exc:
        client.close()
        unavailable("Redis", exc)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def broker_redis() -> Iterator[redis.Redis]:
    yield from _own_redis_db(BROKER_DB)


@pytest.fixture(scope="session")
def store_redis() -> Iterator[redis.Redis]:
    yield from _own_redis_db(STORE_DB)


@pytest.fixture(scope="session")
def shop_database() -> Iterator[str]:
    """A fresh PostgreSQL database for the shop, dropped at the end of the run."""
    import psycopg

    admin_url = PG_BASE.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    try:
        admin = psycopg.connect(admin_url, autocommit=True)
    except psycopg.Error as exc:
        unavailable("PostgreSQL", exc)
    with admin:
        admin.execute(f'CREATE DATABASE "{SHOP_DB}"')
    url = os.environ["DATABASE_URL"]
    from tasks import db, shop

    with db.transaction() as session:
        shop.seed(session, customers=3, orders=20)
    yield url
    if db._engine is not None:
        db._engine.dispose()
        db._engine = None
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{SHOP_DB}" WITH (FORCE)')


@pytest.fixture(scope="session")
def services(broker_redis: redis.Redis, store_redis: redis.Redis, shop_database: str) -> None:
    """Every real service the integration tests need, isolated for this run."""


@pytest.fixture
def clean_store(services: None, store_redis: redis.Redis) -> redis.Redis:
    """The layer's store, emptied before the test."""
    store_redis.flushdb()
    return store_redis


@pytest.fixture(scope="module")
def thread_worker(services: None) -> Iterator[Any]:
    """An in-process worker (threads) on both queues: fast, for most integration tests.

    Module-scoped, so that it never consumes behind the back of a test that runs its
    own worker processes."""
    from celery.contrib.testing.worker import start_worker

    from conventions.testing.worker import own_event_loop
    from tasks import app

    with (
        own_event_loop(),
        start_worker(
            app,
            pool="threads",
            concurrency=4,
            queues=["email", "heavy"],
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=20,
        ) as worker,
    ):
        yield worker


class WorkerProcess:
    """A real ``celery -A tasks worker`` subprocess."""

    def __init__(  # noqa: PLR0917
        self,
        name: str,
        queues: str,
        log: Path,
        concurrency: int,
        env: dict[str, str],
        include: str = "tests.integration.support_jobs",
    ) -> None:
        self.name = name
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tasks",
                "worker",
                "-Q",
                queues,
                "-c",
                str(concurrency),
                "-P",
                "prefork",
                "-n",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
                "-I",
                include,
            ],
            cwd=ROOT,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b" ready." in self.log.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.output()}")
            time.sleep(0.05)
        raise TimeoutError(f"worker {self.name} not ready:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30, signalled: bool = False) -> None:
        """Send ``sig`` (unless ``signalled``: already sent) and wait for the exit."""
        if self.proc.poll() is None:
            if not signalled:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


@pytest.fixture
def worker_process(services: None, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker subprocesses: ``worker_process("w1", "email,heavy")``."""
    started: list[WorkerProcess] = []

    def start(
        name: str,
        queues: str = "email,heavy",
        concurrency: int = 2,
        include: str = "tests.integration.support_jobs",
        **env: str,
    ) -> WorkerProcess:
        """``include``: comma-separated modules of test-only jobs the worker imports."""
        full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        worker = WorkerProcess(
            name, queues, tmp_path / f"{name}.log", concurrency, full_env, include=include
        )
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    # every worker's warm shutdown at once, then one wait each
    running = [worker for worker in started if worker.proc.poll() is None]
    for worker in running:
        worker.proc.send_signal(signal.SIGTERM)
    for worker in started:
        worker.stop(signalled=worker in running)


@pytest.fixture
def spare_store() -> Iterator[Any]:
    """The app's store on a Redis server of the test's own, to stop and start (the
    machine's Redis, the broker, is untouched)."""
    from conventions.store.redis import RedisStore
    from tasks import app
    from tests.integration.helpers import SpareRedis

    if shutil.which("redis-server") is None:
        unavailable("redis-server (a store of the test's own)", FileNotFoundError("redis-server"))
    spare = SpareRedis()
    spare.start()
    store = RedisStore(f"redis://127.0.0.1:{spare.port}/0")
    previous = app.__dict__.get("_cc_store")
    app.__dict__["_cc_store"] = store
    yield spare
    app.__dict__["_cc_store"] = previous
    spare.stop()
    store.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A Redis Cluster of three masters on ports 7100-7102 (the store contract's), of
    this session's own: started once, stopped at the end
    (:mod:`tests.integration.support_cluster`)."""
    from tests.integration import support_cluster

    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        unavailable("redis-server and redis-cli", FileNotFoundError("redis-server"))
    yield from support_cluster.running(support_cluster.CONTRACT_PORTS)
