"""``conventions migrate --apply`` killed inside a step (a real ``kill -9`` of a real
``python -m conventions`` process) resumes on the next run: the steps that ended are
not run again, the step it was inside goes on from its saved cursor, each item of it is
done exactly once; and two migrates at once: the second waits for the first, or refuses
when its ``--wait`` is over, naming the holder. On the store on Redis and on PostgreSQL,
with the probe steps of ``support_migrate.PROBE_APP``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import redis

from tests.integration.support_migrate import (
    HANG_GUARD,
    STORE,
    effects,
    finish,
    postgres_url,
    probe_app,
    redis_dbs,
    spawn,
    wait_for,
)

__all__ = ["postgres_url", "redis_dbs"]

Dbs = tuple[redis.Redis, redis.Redis]
#: every item of the probe's first step once, then its second step
ONCE = [*(f"probe1:{item}" for item in range(5)), "probe2"]


@pytest.fixture(
    params=["redis_store", pytest.param("sql_store", marks=pytest.mark.chaos)]
)  # each run starts four to five processes: PostgreSQL's runs in make chaos
def probe(request: pytest.FixtureRequest, tmp_path: Path, redis_dbs: Dbs) -> Path:
    """The probe app on the store of the param's kind."""
    kind = str(request.param)
    store = STORE if kind == "redis_store" else str(request.getfixturevalue("postgres_url"))
    return probe_app(tmp_path, store, kind)


def test_a_migrate_killed_inside_a_step_resumes_it_and_finishes_exactly_once(probe: Path) -> None:
    first = spawn(probe, "--apply", "--lock-ttl", "2")
    wait_for(lambda: (probe / "waiting").exists() or first.poll() is not None, "the probe step")
    assert first.poll() is None, finish(first)
    os.kill(first.pid, signal.SIGKILL)
    killed = finish(first)  # reads and closes its pipes
    assert killed[0] == -signal.SIGKILL
    assert effects(probe) == ["probe1:0", "probe1:1"]

    dry = finish(spawn(probe))
    (probe / "gate").touch()
    again = finish(spawn(probe, "--apply", "--lock-ttl", "2", "--wait", "60"))
    last = finish(spawn(probe, "--apply"))

    assert dry[0] == 0, dry
    assert "step test_probe 1: probe one (resumes from 2)" in dry[1]
    assert "step store_" not in dry[1]  # the store's own step ended before the kill
    assert again[0] == 0, again
    assert "step test_probe 1: probe one (resumes from 2)" in again[1]
    assert "step test_probe 2: probe two" in again[1]
    assert effects(probe) == ONCE
    assert last[0] == 0, last
    assert "nothing to do" in last[1]
    assert effects(probe) == ONCE


def test_a_second_migrate_waits_for_the_first_or_refuses_after_its_wait(probe: Path) -> None:
    first = spawn(probe, "--apply")
    wait_for(lambda: (probe / "waiting").exists() or first.poll() is not None, "the probe step")
    assert first.poll() is None, finish(first)

    refused = finish(spawn(probe, "--apply", "--wait", "1", "--json"))
    log = probe / "waiting.log"
    waiting = spawn(probe, "--apply", "--wait", "90", out=log)
    wait_for(lambda: "waiting up to 90s for the lock" in log.read_text(), "the second's wait")
    (probe / "gate").touch()
    done = finish(first)
    waiting.wait(timeout=HANG_GUARD)
    waited = log.read_text()

    assert refused[0] == 1, refused
    assert "another migrate holds the store" in refused[2]
    assert "another migrate holds the store" in json.loads(refused[1])["refused"]
    assert done[0] == 0, done
    assert waiting.returncode == 0, waited
    assert "done: 0 step(s) ran" in waited
    assert effects(probe) == ONCE
