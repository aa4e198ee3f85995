"""What the migrate tests share: an app of the test's own on real Redis and a SQL store
(PostgreSQL in a database of its own, or SQLite), the migrate run in-process or as a
real ``python -m conventions`` subprocess, and a probe step that waits on a file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
import redis

from conventions import App
from conventions.cli.main import cli
from conventions.config import profile
from tests.conftest import BROKER_DB, PG_BASE, REDIS_BASE, STORE_DB

#: a hang guard only: each command answers in seconds
HANG_GUARD = 120.0
BROKER = f"{REDIS_BASE}/{BROKER_DB}"
STORE = f"{REDIS_BASE}/{STORE_DB}"

#: an app module with two probe steps of format ``test_probe`` on the store's kind: the
#: first writes items 0..4 to the effects file, saving its cursor after each, and waits
#: for the gate file before item 2; the second writes one line
PROBE_APP = """
import time
from pathlib import Path

from conventions import App
from conventions.config import profile
from conventions.upgrade.steps import Step, register

app = App("migrate_probe")
app.conf.update(profile.reliable(broker_url={broker!r}, store_url={store!r},
                                 result_backend={broker!r}))
app.conf.conventions_doctor_levels = {{"redis-no-persistence": "warning"}}  # a test Redis
DIR = Path({dir!r})


def preview(place, cursor):
    return [f"write items {{cursor or 0}}..4"]


def write(line):
    with open(DIR / "effects", "a") as out:
        out.write(line + "\\n")


def one(place, progress):
    start = int(progress.cursor or 0)
    for item in range(start, 5):
        if item == 2:
            (DIR / "waiting").touch()
            while not (DIR / "gate").exists():
                time.sleep(0.05)
        write(f"probe1:{{item}}")
        progress.save(str(item + 1))
    return [f"wrote items {{start}}..4"]


def two(place, progress):
    write("probe2")
    return ["wrote probe2"]


register(Step({kind!r}, "test_probe", 1, "probe one", preview, one))
register(Step({kind!r}, "test_probe", 2, "probe two", preview, two))
"""


def make_app(store: str) -> App:
    app = App(f"migrate_{uuid.uuid4().hex[:6]}")
    app.conf.update(profile.reliable(broker_url=BROKER, store_url=store, result_backend=BROKER))
    return app


@pytest.fixture
def new_app() -> Iterator[Callable[[str], App]]:
    """``new_app(store_url)``: an app of the test's own; its store is closed after."""
    made: list[App] = []

    def make(store: str) -> App:
        made.append(make_app(store))
        return made[-1]

    yield make
    for app in made:
        if "_cc_store" in app.__dict__:
            app.store.close()


def migrate(app: App, *args: str, capsys: Any) -> tuple[int, str, str]:
    """``conventions migrate ARGS`` in-process on ``app``: exit status, stdout, stderr."""
    capsys.readouterr()
    try:
        code = cli.main(["migrate", *args], obj=SimpleNamespace(app=app), standalone_mode=False)
    except SystemExit as exc:  # ctx.exit(code)
        code = exc.code
    except Exception as exc:
        if not hasattr(exc, "exit_code"):
            raise
        exc.show()  # type: ignore[attr-defined]
        code = exc.exit_code
    out = capsys.readouterr()
    return int(code or 0), out.out, out.err


def probe_app(tmp_path: Path, store: str, kind: str) -> Path:
    (tmp_path / "migrate_probe.py").write_text(
        PROBE_APP.format(broker=BROKER, store=store, dir=str(tmp_path), kind=kind)
    )
    return tmp_path


def spawn(tmp_path: Path, *args: str, out: Path | None = None) -> subprocess.Popen[str]:
    """``python -m conventions -A migrate_probe migrate ARGS``, a real process (its
    output, unbuffered, into the file ``out`` when given)."""
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "conventions", "-A", "migrate_probe", "migrate", *args]
    if out is None:
        return subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
    with out.open("w") as sink:
        return subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True
        )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=HANG_GUARD)
    return process.returncode, out, err


def wait_for(condition: Callable[[], bool], what: str, deadline: float = 90.0) -> None:
    """Until ``condition()`` holds (a generous deadline: the machine is shared)."""
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects"
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def redis_dbs() -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """The broker's and the store's Redis databases, emptied."""
    clients = []
    for url in (BROKER, STORE):
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            client.ping()
        except redis.ConnectionError as exc:
            if os.environ.get("CI"):
                raise
            pytest.skip(f"Redis is not running ({exc})")
        client.flushdb()
        clients.append(client)
    yield clients[0], clients[1]
    for client in clients:
        client.flushdb()
        client.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL database of the test's own (dropped after)."""
    name = f"cc_migrate_{uuid.uuid4().hex[:8]}"
    admin_url = PG_BASE.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    try:
        admin = psycopg.connect(admin_url, autocommit=True)
    except psycopg.Error as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL is not running ({exc})")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_BASE}/{name}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["postgresql", "sqlite"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQL store's URL: PostgreSQL (a database of its own) or SQLite (a file)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("postgres_url"))
