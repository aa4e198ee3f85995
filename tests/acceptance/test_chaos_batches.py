"""A batch of 2,000 jobs through kill -9 of pool processes and whole workers and a
Redis crash with AOF: its callbacks run once each, after the last member ended, with the
right counts; dead-lettered members replayed afterwards fire ``on_success`` once. The
same with a batch of 500 on RabbitMQ (quorum queues; a private node,
:mod:`tests.acceptance.rabbit_node`), the store on Redis, through kill -9s only.

The run is :mod:`tests.acceptance.chaos_runs`' crew (two prefork workers kept alive, a
killed one replaced) on a Redis server of the test's own (AOF, fsync always). The blows
land while the batch's members run; the Redis kill lands once every member is published.
The callbacks record, in the same server, what the batch said when they ran
(:mod:`tests.acceptance.support_batch_chaos`). The seed is printed (``CHAOS_SEED``).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from conventions.store.redis import RedisStore
from tests.acceptance import rabbit_node
from tests.acceptance.chaos_runs import Crew
from tests.acceptance.rabbit_node import RabbitNode
from tests.acceptance.support_batch_chaos import BODIES, RUNS
from tests.acceptance.support_chaos import (
    ROOT,
    RedisServer,
    Worker,
    chaos_seed,
    own_redis,
    shop_database,
    worker_env,
)
from tests.fixtures import unavailable

pytestmark = pytest.mark.chaos

MEMBERS = 2000
BAD = 7
INCLUDE = "tests.acceptance.support_batch_chaos"
#: ``support_raw_chord.RUNS`` (not imported here: that module makes a Celery app)
RAW_RUNS = "raw-chord-runs:"
#: the longest the batch may take to end, blows included (the sweep's 15 s period and
#: 30 s grace included: a callback whose publisher died is published by it)
DEADLINE = 200.0


class BatchCrew(Crew):
    """The chaos crew, whose workers also import the batch's jobs (or, ``raw``, raw
    Celery's chord app)."""

    raw = False

    def _start_one(self) -> None:
        with self.lock:
            name = f"batch-{len(self.all) + 1}"
            if self.raw:
                app, queue, include = "tests.acceptance.support_raw_chord", "celery", ""
            else:
                app, queue, include = "tasks", "email", INCLUDE
            worker = Worker(app, name, queue, self.env, self.folder, include=include)
            self.all.append(worker)
        worker.wait_ready()
        with self.lock:
            self.live.append(worker)


@pytest.fixture
def env(chaos_redis: RedisServer) -> Iterator[dict[str, str]]:
    """The workers' and helpers' environment (the shop's database is unused, but the
    reference app's settings name one)."""
    with shop_database(1) as engine:
        yield worker_env(chaos_redis, engine)


@pytest.fixture
def chaos_redis(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    with own_redis(folder) as server:
        yield server


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RabbitNode]:
    if not rabbit_node.installed():
        unavailable("rabbitmq-server (a node of the test's own)", FileNotFoundError("rabbitmq"))
    folder = tmp_path / "rabbit"
    folder.mkdir()
    with rabbit_node.private_node(folder) as started:
        yield started


def _helper(
    env: dict[str, str], *args: str, module: str = "tests.acceptance.support_batch_chaos"
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _finished(process: subprocess.Popen[bytes], timeout: float = 180) -> str:
    out, _ = process.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    assert process.returncode == 0, text
    return text


def _runs(recorder: redis.Redis, key: str) -> list[dict[str, int | str]]:
    try:
        return [json.loads(item) for item in recorder.lrange(RUNS + key, 0, -1)]
    except redis.ConnectionError:
        return []


def _wait_runs(
    recorder: redis.Redis, key: str, count: int, deadline: float
) -> list[dict[str, Any]]:
    while time.monotonic() < deadline:
        runs = _runs(recorder, key)
        if len(runs) >= count:
            time.sleep(3.0)  # a second run of a callback would show up now
            return _runs(recorder, key)
        time.sleep(0.5)
    return _runs(recorder, key)


@pytest.mark.timeout(600)
def test_a_batch_of_two_thousand_through_kill_nines_and_a_redis_crash_calls_back_once(
    chaos_redis: RedisServer, env: dict[str, str], tmp_path: Path
) -> None:
    seed = chaos_seed("batch")
    rng = random.Random(seed)
    key = f"chaos-{seed:x}"
    folder = tmp_path / "workers"
    folder.mkdir()
    crew = BatchCrew("ours", env, folder)
    recorder = redis.Redis.from_url(chaos_redis.url(2), decode_responses=True)
    try:
        crew.start(2)
        submitter = _helper(env, "submit", key, str(MEMBERS), str(BAD))
        blows = _strike(crew, rng, chaos_redis, submitter)
        print("blows: " + "; ".join(blows))

        started = time.monotonic()
        runs = _wait_runs(recorder, key, 1, started + DEADLINE)
        print(f"after the blows: {runs}")
        assert [run["which"] for run in runs] == ["on_complete"], runs
        (complete,) = runs
        # it ran once, after every member had ended, with the right counts
        assert complete == {
            "which": "on_complete", "pending": 0, "succeeded": MEMBERS - BAD, "failed": BAD,
            "dead": BAD, "ended_members": MEMBERS, "total": MEMBERS,
        }, complete  # fmt: skip

        print(_finished(_helper(env, "replay", key)).strip())
        runs = _wait_runs(recorder, key, 2, time.monotonic() + DEADLINE)
        print(f"after the replays: {runs}")
        assert [run["which"] for run in runs] == ["on_complete", "on_success"], runs
        assert runs[1] == {
            "which": "on_success", "pending": 0, "succeeded": MEMBERS, "failed": 0,
            "dead": 0, "ended_members": MEMBERS, "total": MEMBERS,
        }, runs[1]  # fmt: skip
        store = RedisStore(chaos_redis.url(1))
        status = store.get_batch(key)
        store.close()
        assert status is not None and status.callback_states == {
            "on_success": "sent", "on_complete": "sent"
        }  # fmt: skip
        bodies = recorder.hgetall(BODIES + "all")
        print(f"bodies run: {len(bodies)} members, {sum(map(int, bodies.values()))} runs "
              f"(a member killed mid-run runs again: at least once)")  # fmt: skip
        assert len(bodies) == MEMBERS
    finally:
        crew.stop()
        recorder.close()


def _kill_nines(crew: Crew, rng: random.Random, wholes: int, children: int) -> list[str]:
    """``wholes`` whole workers and ``children`` pool processes killed (-9), in an order
    the seed picks, 0.3 to 2 s apart."""
    plan = [partial(Crew.kill_nine, whole=True)] * wholes
    plan += [partial(Crew.kill_nine, whole=False)] * children
    rng.shuffle(plan)
    blows = []
    for blow in plan:
        blows.append(blow(crew, rng))
        time.sleep(rng.uniform(0.3, 2.0))
    return blows


def _strike(
    crew: Crew, rng: random.Random, chaos_redis: RedisServer, submitter: subprocess.Popen[bytes]
) -> list[str]:
    """The same blows for the batch and for raw Celery's chord: five kill -9 (two whole
    workers, three pool children) in a shuffled order, the submitter's end awaited after
    the third, then a Redis kill -9 restarted from its AOF, then the last two."""
    plan = [partial(Crew.kill_nine, whole=True)] * 2 + [partial(Crew.kill_nine, whole=False)] * 3
    rng.shuffle(plan)
    blows: list[str] = []
    time.sleep(rng.uniform(1.0, 3.0))
    for blow in plan[:3]:
        blows.append(blow(crew, rng))
        time.sleep(rng.uniform(0.3, 2.0))
    print(_finished(submitter).strip())
    down = rng.uniform(1.0, 3.0)
    chaos_redis.restart(signal.SIGKILL, down=down)
    blows.append(f"Redis kill -9, restarted from its AOF after {down:.1f}s down")
    for blow in plan[3:]:
        blows.append(blow(crew, rng))
        time.sleep(rng.uniform(0.3, 2.0))
    return blows


@pytest.mark.timeout(600)
def test_a_batch_of_five_hundred_on_rabbitmq_through_kill_nines_calls_back_once(
    node: RabbitNode, chaos_redis: RedisServer, tmp_path: Path
) -> None:
    """The broker is RabbitMQ (the workload queue a quorum queue, as the profile makes
    it), the store and the callbacks' records on Redis: five kill -9s (two whole
    workers, three pool processes) while the members run."""
    members, bad = 500, 5
    seed = chaos_seed("batch-rabbitmq")
    rng = random.Random(seed)
    key = f"chaos-rabbit-{seed:x}"
    folder = tmp_path / "workers"
    folder.mkdir()
    recorder = redis.Redis.from_url(chaos_redis.url(2), decode_responses=True)
    with shop_database(1) as engine:
        env = worker_env(chaos_redis, engine, CELERY_BROKER_URL=node.url)
        crew = BatchCrew("ours", env, folder)
        try:
            crew.start(2)
            assert "quorum" in node.ctl("list_queues", "name", "type").split("email", 1)[1]
            submitter = _helper(env, "submit", key, str(members), str(bad))
            time.sleep(rng.uniform(1.0, 3.0))
            blows = _kill_nines(crew, rng, wholes=2, children=3)
            print(_finished(submitter).strip())
            print("blows: " + "; ".join(blows))

            runs = _wait_runs(recorder, key, 1, time.monotonic() + DEADLINE)
            print(f"after the blows: {runs}")
            assert [run["which"] for run in runs] == ["on_complete"], runs
            assert runs[0] == {
                "which": "on_complete", "pending": 0, "succeeded": members - bad,
                "failed": bad, "dead": bad, "ended_members": members, "total": members,
            }, runs[0]  # fmt: skip

            print(_finished(_helper(env, "replay", key)).strip())
            runs = _wait_runs(recorder, key, 2, time.monotonic() + DEADLINE)
            print(f"after the replays: {runs}")
            assert [run["which"] for run in runs] == ["on_complete", "on_success"], runs
            assert runs[1] == {
                "which": "on_success", "pending": 0, "succeeded": members, "failed": 0,
                "dead": 0, "ended_members": members, "total": members,
            }, runs[1]  # fmt: skip
            bodies = recorder.hgetall(BODIES + "all")
            print(f"bodies run: {len(bodies)} members, {sum(map(int, bodies.values()))} runs")
            assert len(bodies) == members
        finally:
            crew.stop()
            recorder.close()


@pytest.mark.timeout(400)
def test_raw_celerys_chord_under_the_same_blows_outcome_printed(
    chaos_redis: RedisServer, env: dict[str, str], tmp_path: Path
) -> None:
    """Not an assertion on Celery: what its chord did under the same five kill -9s and
    Redis crash (late acks, reject on worker lost), printed for the docs to quote."""
    seed = chaos_seed("batch-raw-chord")
    rng = random.Random(seed)
    key = f"raw-{seed:x}"
    folder = tmp_path / "workers"
    folder.mkdir()
    raw_env = {**env, "CONVENTIONS_VISIBILITY_TIMEOUT": "10"}
    crew = BatchCrew("acks_late", raw_env, folder)
    crew.raw = True
    recorder = redis.Redis.from_url(chaos_redis.url(2), decode_responses=True)
    try:
        crew.start(2)
        submitter = _helper(raw_env, key, str(MEMBERS), module="tests.acceptance.support_raw_chord")
        blows = _strike(crew, rng, chaos_redis, submitter)
        print("blows: " + "; ".join(blows))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not recorder.llen(RAW_RUNS + key):
            time.sleep(1.0)
        time.sleep(15.0)  # a second body run (a redelivered header) would show up now
        runs = [json.loads(item) for item in recorder.lrange(RAW_RUNS + key, 0, -1)]
        print(f"raw Celery chord of {MEMBERS} (late acks) through the same blows: "
              f"its body ran {len(runs)} time(s): {runs}")  # fmt: skip
    finally:
        crew.stop()
        recorder.close()
