"""The chaos suite's harness: its own Redis server, its own shop database, real workers.

Everything a chaos run touches is its own: a ``redis-server`` on a free port (AOF on,
fsync on every write, so it can be killed and restarted without losing an acknowledged
write), a fresh PostgreSQL database seeded with one payment event per order, and
``celery worker`` subprocesses pointed at both through their environment. The machine's
Redis is never used, so killing and restarting the broker harms nobody else's tests.

The business effect is counted in the database: ``shop.apply_payment`` adds an event's
amount to its order every time it runs (on purpose), so with one event per order

* a **lost** job is an event never applied (``applied_at`` is NULL);
* a **duplicated** effect is an order whose ``paid_minor`` is a multiple >= 2 of its
  event's amount (each extra multiple counts once).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, text

from tasks import shop
from tests.isolation import free_port

ROOT = Path(__file__).resolve().parents[2]
#: the chaos suite's base seed: fixed, so that a failing run can be replayed
#: (``CHAOS_SEED=<n> pytest -m chaos``); each run derives its own from it by name
BASE_SEED = 20261201


def chaos_seed(run: str) -> int:
    """The seed of one named chaos run: fixed, printed, overridable by ``CHAOS_SEED``."""
    base = int(os.environ.get("CHAOS_SEED", BASE_SEED))
    seed = zlib.crc32(f"{base}:{run}".encode())
    print(f"\nchaos seed for {run}: {seed} (base seed {base}; CHAOS_SEED={base} replays it)")
    return seed


LOST = "SELECT count(*) FROM payment_events WHERE applied_at IS NULL"
APPLIED = "SELECT count(*) FROM payment_events WHERE applied_at IS NOT NULL"
#: extra applications: with one event per order, paid = k x amount means k - 1 extra
DUPLICATED = """
    SELECT coalesce(sum(o.paid_minor / e.amount_minor - 1), 0) FROM orders o
    JOIN payment_events e ON e.order_id = o.id WHERE o.paid_minor > e.amount_minor
"""
#: paid orders whose receipt was never recorded (crash window 7 of delivery-guarantees.md)
MISSING_RECEIPTS = """
    SELECT count(*) FROM orders o WHERE o.status = 'paid'
      AND NOT EXISTS (SELECT 1 FROM sent_emails s WHERE s.order_id = o.id)
"""
RECEIPTS = "SELECT count(*) FROM sent_emails"


class RedisServer:
    """A ``redis-server`` of the test's own, which the test may kill and restart."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: the chaos suite needs its own")
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        """Start (or start again, on the same port and AOF files) and wait for PONG."""
        log = (self.folder / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                "--dir", str(self.folder), "--daemonize", "no",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.BusyLoadingError:
                    pass  # replaying the AOF
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(20)
        self.proc = None

    def restart(self, sig: int = signal.SIGKILL, down: float = 2.0) -> None:
        """Kill the server (SIGKILL by default: a crash, not a clean shutdown), stay down
        for ``down`` seconds, start it again from its append-only file."""
        self.stop(sig)
        time.sleep(down)
        self.start()
        self.restarts += 1


@contextlib.contextmanager
def own_redis(folder: Path) -> Iterator[RedisServer]:
    """A started :class:`RedisServer`, stopped (and its files left in ``folder``) after."""
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def shop_database(orders: int) -> Iterator[Engine]:
    """A fresh PostgreSQL database with ``orders`` orders of one payment event each
    (``evt_0001``..), the shop's schema and the ``once`` markers' table; dropped after."""
    import psycopg

    from conventions.transactional import once
    from tests.conftest import PG_BASE  # not at import: it rewrites the environment

    name = f"cc_chaos_{uuid.uuid4().hex[:8]}"
    admin_url = PG_BASE.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    engine = shop.make_engine(f"{PG_BASE}/{name}")
    try:
        shop.create_schema(engine)
        once.create_table(engine)
        with shop.session_factory(engine)() as session, session.begin():
            shop.seed(session, customers=3, orders=orders)
        yield engine
    finally:
        engine.dispose()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def scalar(engine: Engine, sql: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text(sql)).scalar_one())


def event_ids(count: int) -> list[str]:
    return [f"evt_{number:04d}" for number in range(1, count + 1)]


class Worker:
    """A real ``celery -A <app> worker`` subprocess (prefork), in its own session."""

    def __init__(  # noqa: PLR0917
        self,
        app: str,
        name: str,
        queue: str,
        env: dict[str, str],
        folder: Path,
        include: str = "",
        launcher: list[str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        """``launcher``: what runs ``celery`` (default ``python -m celery``; a skewed
        clock's: :func:`tests.acceptance.support_faketime.launcher`; another release's:
        :mod:`tests.acceptance.support_release`). ``cwd``: the project's folder."""
        self.name = name
        extra = ["-I", include] if include else []
        self.log = folder / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    *(launcher or [sys.executable, "-m", "celery"]), "-A", app, "worker",
                    "-Q", queue,
                    "-c", "2", "-P", "prefork", "-n", f"{name}@%h", "--without-gossip",
                    "--without-mingle", "--loglevel=INFO", *extra,
                ],
                cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> Worker:
        deadline = time.monotonic() + timeout
        while b" ready." not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.name} did not start:\n{self.output()[-3000:]}")
            time.sleep(0.2)
        return self

    def children(self) -> list[int]:
        listed = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(self.proc.pid)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return [int(field) for field in listed.stdout.split()]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_all(self) -> None:
        """SIGKILL the whole worker, main process and pool at once (a lost machine)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 60) -> None:
        """SIGTERM: Celery's warm shutdown (running jobs finish, reserved ones go back)."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_all()
        with contextlib.suppress(ProcessLookupError):  # no orphan left behind
            os.killpg(self.proc.pid, signal.SIGKILL)


#: the recovery bound of the chaos workers of ours (seconds): short, so that a dead
#: worker's messages come back within the run (the default, 30, is measured apart)
CHAOS_RECOVERY = "6"
#: settings of the caller's environment a chaos worker never inherits
INHERITED_NOT = frozenset({
    "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "CONVENTIONS_VISIBILITY_TIMEOUT",
    "CONVENTIONS_UNACKED_RESTORE_INTERVAL", "CONVENTIONS_UNACKED_MUTEX_EXPIRE",
    "CONVENTIONS_CLOCK_OFFSET_SECONDS", "CONVENTIONS_RECOVERY_TIMEOUT",
})  # fmt: skip


def worker_env(server: RedisServer, engine: Engine, **extra: str) -> dict[str, str]:
    """The environment of a chaos worker or publisher: our Redis, our database, short
    timeouts so that a dead worker's messages come back within the run (ours: the
    recovery bound; raw Celery's: the visibility timeout and kombu's sweep)."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_NOT}
    env |= {
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": server.url(0),
        "CONVENTIONS_STORE_URL": server.url(1),
        "DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "CONVENTIONS_LEASE_SECONDS": "3",
        "CONVENTIONS_RECOVERY_TIMEOUT": CHAOS_RECOVERY,
    }
    if extra.get("RAW_PROFILE", "ours") != "ours":
        env.update({
            "CONVENTIONS_VISIBILITY_TIMEOUT": "10",
            "CONVENTIONS_UNACKED_RESTORE_INTERVAL": "2",
            "CONVENTIONS_UNACKED_MUTEX_EXPIRE": "5",
        })  # fmt: skip
    env.update(extra)
    return env


def publish(kind: str, count: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start a publisher process: ``count`` payment jobs, one per event, through
    ``payments.apply_event.v1`` (``kind="ours"``) or the raw Celery task."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.acceptance.support_chaos", kind, str(count)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


@dataclass
class Outcome:
    """What one chaos run did to the business data."""

    scenario: str
    profile: str
    jobs: int
    lost: int
    duplicated: int
    seconds: float
    chaos: str
    receipts: int | None = None
    missing_receipts: int | None = None
    dead_letters: int | None = None
    #: the first lost events, for the diagnosis
    lost_events: list[str] | None = None

    def as_row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def measure(engine: Engine, *, receipts: bool) -> dict[str, Any]:
    with engine.connect() as connection:
        lost_events = connection.execute(
            text("SELECT id FROM payment_events WHERE applied_at IS NULL ORDER BY id LIMIT 10")
        ).scalars()
        first_lost = list(lost_events)
    return {
        "lost_events": first_lost,
        "lost": scalar(engine, LOST),
        "duplicated": scalar(engine, DUPLICATED),
        "receipts": scalar(engine, RECEIPTS) if receipts else None,
        "missing_receipts": scalar(engine, MISSING_RECEIPTS) if receipts else None,
    }


def _publish_main(kind: str, count: int) -> None:
    """The publisher process (environment from :func:`worker_env`; never import
    ``tests.conftest`` here: it points ``REDIS_URL`` at the machine's Redis)."""
    ids = event_ids(count)
    if kind == "ours":
        from tasks.payments import apply_event

        for event_id in ids:
            apply_event.delay(event_id=event_id)
    else:
        from tests.acceptance.support_raw import apply_event as raw_apply_event

        for event_id in ids:
            raw_apply_event.delay(event_id)
    print(f"published {count}", flush=True)


def publish_delayed(env: dict[str, str], spec: list[dict[str, Any]]) -> None:
    """Publish one payment job per item of ``spec`` (``event_id`` and ``countdown`` or
    ``eta``, an ISO 8601 string) from a publisher process, and wait for it."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.acceptance.support_chaos", "delayed", json.dumps(spec)],
        cwd=ROOT, env=env, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace")


def _publish_delayed_main(spec: list[dict[str, Any]]) -> None:
    from tasks.payments import apply_event

    for item in spec:
        options = {k: item[k] for k in ("countdown", "eta") if item.get(k) is not None}
        apply_event.apply_async(kwargs={"event_id": item["event_id"]}, **options)
    print(f"published {len(spec)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "delayed":
        _publish_delayed_main(json.loads(sys.argv[2]))
    else:
        _publish_main(sys.argv[1], int(sys.argv[2]))
