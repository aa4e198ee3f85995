"""A backend that does not answer: every command says so in one line and exits 3.

The broker, the result backend and the store point at a real Redis server of the test's
own that is stopped (connections refused) or frozen with SIGSTOP (connections accepted by
the kernel, never answered: the case that made ``conventions status`` hang for good).
The elapsed time is printed, never asserted; a subprocess timeout guards against a hang.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.fixtures import ROOT, unavailable
from tests.integration.helpers import SpareRedis

#: the exit status of "a backend did not answer" (docs/reference/cli.md)
UNREACHABLE = 3
#: a hang guard only: with --timeout 1 each command answers in a few seconds
HANG_GUARD = 30.0


@pytest.fixture(autouse=True, scope="module")
def redis_server() -> None:
    """These tests stop and freeze Redis servers of their own: ``redis-server`` is needed
    (skipped on a laptop without it, a failure in CI: ``unavailable``)."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server (a Redis of the test's own)", FileNotFoundError("redis-server"))


@pytest.fixture(scope="module")
def stopped_redis() -> Iterator[str]:
    """The URL of a Redis server that ran and was stopped: its port refuses."""
    spare = SpareRedis()
    spare.start()
    spare.stop()
    yield f"redis://127.0.0.1:{spare.port}/0"


@pytest.fixture
def frozen_redis() -> Iterator[str]:
    """The URL of a real Redis server frozen with SIGSTOP: it accepts, never answers."""
    spare = SpareRedis()
    spare.start()
    assert spare.proc is not None
    os.kill(spare.proc.pid, signal.SIGSTOP)
    yield f"redis://127.0.0.1:{spare.port}/0"
    os.kill(spare.proc.pid, signal.SIGCONT)
    spare.stop()


def conventions(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``conventions -A tasks --timeout 1 ARGV`` with every backend at ``url``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url,
           "CONVENTIONS_STORE_URL": url}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", "--timeout", "1", *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD, check=False,
    )  # fmt: skip
    print(f"conventions {' '.join(argv)}: exit {done.returncode} "
          f"after {time.monotonic() - started:.1f}s")  # fmt: skip
    return done


def assert_one_line_unreachable(done: subprocess.CompletedProcess[str], url: str) -> None:
    assert done.returncode == UNREACHABLE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "did not answer" in lines[0]
    assert url.removeprefix("redis://").split("/")[0] in lines[0]  # which server
    assert "Traceback" not in done.stderr


COMMANDS = {
    "status": ["status", "some-job"],
    "doctor": ["doctor"],
    "queues": ["queues"],
    "dlq list": ["dlq", "list"],
    "dlq list --json": ["dlq", "list", "--json"],
    "batches list": ["batches", "list"],
    "batches end": ["batches", "end", "b-1", "m-1", "--outcome", "failed", "--reason", "lost"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_stopped_redis_is_one_line_and_exit_3(name: str, stopped_redis: str) -> None:
    done = conventions(stopped_redis, *COMMANDS[name])

    assert_one_line_unreachable(done, stopped_redis)
    assert done.stdout == ""


@pytest.mark.parametrize("name", ["status", "dlq list"])
def test_a_redis_that_never_answers_is_one_line_and_exit_3(name: str, frozen_redis: str) -> None:
    done = conventions(frozen_redis, *COMMANDS[name])

    assert_one_line_unreachable(done, frozen_redis)


def test_an_outbox_database_that_refuses_is_one_line_and_exit_3(stopped_redis: str) -> None:
    spare = SpareRedis()  # a free port: nothing listens there
    database = f"postgresql://postgres@127.0.0.1:{spare.port}/outbox"

    done = conventions(stopped_redis, "outbox", "status", "--url", database)

    assert done.returncode == UNREACHABLE, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "the outbox database" in done.stderr
