"""One clock: real ``celery`` workers whose wall clock is wrong (libfaketime, the monotonic
clock kept real) beside a correct one, on a Redis of the test's own. Every lease,
in-flight score and due time is decided on the Redis server's clock, so:

* a sweeper whose clock runs 20 s ahead does not give back a job a live worker runs;
* a countdown, and an eta pushed by a foreign producer, do not run before they are due
  on a worker whose clock runs ahead;
* the doctor refuses to start a worker (and beat) whose clock is beyond the bound, and
  the keeper of a running one reports its skew.

Runs are stamped with the Redis clock by the job itself
(:mod:`tests.acceptance.support_clock`). The long fleet run (kills, a jump of five
minutes) is ``tests/acceptance/test_chaos_clock.py``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from conventions.transport import layout
from conventions.worker.lifecycle import EX_CONFIG
from tests.acceptance import support_clock as jobs
from tests.acceptance.support_chaos import (
    CHAOS_RECOVERY,
    ROOT,
    RedisServer,
    Worker,
    own_redis,
    shop_database,
)
from tests.acceptance.support_chaos import worker_env as chaos_env
from tests.acceptance.support_faketime import SkewedClock, launcher, require

INCLUDE = "tests.acceptance.support_clock"
DELAYED = "_cc.delayed.email"
#: the skew a worker may have in these tests without the doctor refusing it
LENIENT = "clock-skew=warning"
#: the recovery bound of these workers (seconds; tests.acceptance.support_chaos')
BOUND = float(CHAOS_RECOVERY)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    require()
    folder = tmp_path / "redis"
    folder.mkdir()
    with own_redis(folder) as started:
        yield started


def wait_for(check: object, timeout: float, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s")


def publish(env: dict[str, str], event_id: str, countdown: float | None = None) -> float:
    """Publish one stamp job from a process with the correct clock; answers the Redis
    clock just before the publish."""
    code = (
        "import json, sys, redis; from tests.acceptance import support_clock as s; "
        "c = redis.Redis.from_url(sys.argv[1]); t = s.redis_now(c); "
        "s.stamp_run.apply_async(kwargs={'event_id': sys.argv[2]}, "
        "countdown=json.loads(sys.argv[3])); print(t)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, env["REDIS_URL"], event_id, json.dumps(countdown)],
        cwd=ROOT, env=env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace")
    return float(done.stdout.decode().split()[-1])


def received(workers: list[Worker]) -> int:
    """Deliveries of the stamp job, counted in the workers' logs."""
    return sum(
        line.count("] received")
        for w in workers
        for line in w.output().splitlines()
        if "testing.stamp_run.v1[" in line
    )


class Beats:
    """The distinct beats (Redis clock) of one worker's keeper, seen by polling its
    liveness score (the Redis clock of its last renewal plus the bound; its consumer
    found by the worker's pid): a keeper sweeps right after each beat but its first,
    so three beats after a moment mean two sweeps done after it."""

    def __init__(self, broker: redis.Redis, worker: Worker, bound: float) -> None:
        self.broker, self.pid, self.bound = broker, str(worker.proc.pid).encode(), bound
        self.seen: set[float] = set()

    def after(self, moment: float) -> int:
        for key in self.broker.scan_iter("_cc.consumer.*"):
            if self.broker.hget(key, "pid") == self.pid:
                consumer = key.decode().removeprefix("_cc.consumer.")
                score = self.broker.zscore("_cc.consumers", consumer)
                if score:
                    self.seen.add(score - self.bound)
        return len([b for b in self.seen if b > moment])


@pytest.mark.timeout(120)
def test_a_sweeper_whose_clock_runs_20s_ahead_does_not_give_back_a_job_a_live_worker_runs(
    server: RedisServer, tmp_path: Path
) -> None:
    with shop_database(1) as engine:
        env = chaos_env(server, engine, CONVENTIONS_DOCTOR_LEVELS=LENIENT)
        broker, store = redis.Redis.from_url(server.url(0)), redis.Redis.from_url(server.url(1))
        store.set(jobs.HOLD + "evt_0001", "1")
        right = Worker("tasks", "right", "email", env, tmp_path, include=INCLUDE).wait_ready()
        workers = [right]
        try:
            publish(env, "evt_0001")
            wait_for(lambda: len(jobs.runs(store, "evt_0001")) == 1, timeout=30)
            clock = SkewedClock(tmp_path, +20.0)
            fast = Worker("tasks", "fast", "email", clock.env(env), tmp_path, include=INCLUDE,
                          launcher=launcher())  # fmt: skip
            workers.append(fast.wait_ready())
            # the fast worker's keeper beats (a renewal, then a sweep, every 2 s with the
            # 6 s bound): wait until it has swept at least twice since the job was claimed
            claimed, beats = jobs.runs(store, "evt_0001")[0][0], Beats(broker, fast, BOUND)
            wait_for(lambda: beats.after(claimed) >= 3, timeout=30)
            assert received(workers) == 1, "the job was delivered again while it ran"
            assert broker.hlen("unacked") == 1 and broker.llen("email") == 0
            # its keeper measured its skew: in the log, and for the exporter's gauge (a beat
            # whose round trip was too long to tell measures nothing: on a loaded machine
            # the first beats may not, so wait for one that did)
            wait_for(lambda: 19 <= layout.clock_skews(broker).get("email", 0.0) <= 21,
                     timeout=30)  # fmt: skip
            wait_for(lambda: "clock is +20." in fast.output() or "clock is +19." in fast.output(),
                     timeout=10)  # fmt: skip
            store.set(jobs.RELEASE + "evt_0001", "1")
            wait_for(lambda: broker.hlen("unacked") == 0, timeout=30)
            assert received(workers) == 1 and len(jobs.runs(store, "evt_0001")) == 1
        finally:
            for worker in workers:
                worker.terminate(timeout=30)
            broker.close()
            store.close()


# 12 s (the faketime fleet of make chaos runs it at scale): in make chaos
@pytest.mark.chaos
@pytest.mark.timeout(120)
def test_a_worker_whose_clock_runs_3s_ahead_runs_neither_a_countdown_nor_a_foreign_eta_early(
    server: RedisServer, tmp_path: Path
) -> None:
    with shop_database(2) as engine:
        env = chaos_env(server, engine, CONVENTIONS_DOCTOR_LEVELS=LENIENT)
        broker, store = redis.Redis.from_url(server.url(0)), redis.Redis.from_url(server.url(1))
        clock = SkewedClock(tmp_path, +3.0)
        fast = Worker("tasks", "fast", "email", clock.env(env), tmp_path, include=INCLUDE,
                      launcher=launcher()).wait_ready()  # fmt: skip
        try:
            countdown = 6.0
            published = publish(env, "evt_0001", countdown)
            # a foreign producer (kombu's own transport) pushes a message with its eta
            # straight into the list: 2 s ahead, already past on the worker's clock
            publish(env, "evt_0002", 3600)
            foreign_due = _push_as_foreign(broker, "evt_0002", ahead=2.0)
            wait_for(lambda: all(jobs.runs(store, e) for e in ("evt_0001", "evt_0002")), 30)
            [(ran, _, _)] = jobs.runs(store, "evt_0001")
            [(foreign_ran, _, _)] = jobs.runs(store, "evt_0002")
            print(f"\n{countdown:g} s countdown on a worker 3 s ahead ran after "
                  f"{ran - published:.2f}s; a foreign eta {foreign_ran - foreign_due:+.2f}s "
                  "from its due time (Redis clock)")  # fmt: skip
            assert ran - published >= countdown
            assert foreign_ran >= foreign_due
        finally:
            fast.terminate(timeout=30)
            broker.close()
            store.close()


def _push_as_foreign(broker: redis.Redis, event_id: str, ahead: float) -> float:
    """Take the event's message out of the delayed set and push it into its list with an
    ``eta`` ``ahead`` seconds on the Redis clock, as kombu's own transport would; answers
    that due time."""
    for member in broker.zrange(DELAYED, 0, -1):
        key, _, raw = member.decode().partition("\n")
        message = json.loads(raw)
        if event_id not in base64.b64decode(message["body"]).decode():
            continue
        due = jobs.redis_now(broker) + ahead
        message["headers"]["eta"] = datetime.fromtimestamp(due, UTC).isoformat()
        with broker.pipeline() as pipe:  # MULTI: the worker sees it whole
            pipe.zrem(DELAYED, member).lpush(key, json.dumps(message)).execute()
        return due
    raise AssertionError(f"{event_id} is not in the delayed set")


@pytest.mark.timeout(60)
def test_the_doctor_refuses_to_start_a_worker_or_beat_whose_clock_runs_20s_ahead(
    server: RedisServer, tmp_path: Path
) -> None:
    with shop_database(1) as engine:
        env = SkewedClock(tmp_path, +20.0).env(chaos_env(server, engine))
        commands = {
            "worker": [*launcher(), "-A", "tasks", "worker", "-Q", "email", "-c", "1"],
            "beat": [*launcher(), "-A", "tasks", "beat", "-s", str(tmp_path / "beat-schedule")],
        }
        out = subprocess.PIPE
        started = {
            name: subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            for name, cmd in commands.items()
        }
        for name, proc in started.items():
            try:
                output = proc.communicate(timeout=45)[0].decode(errors="replace")
            finally:
                proc.kill()
            assert proc.returncode == EX_CONFIG, f"{name}:\n{output[-2000:]}"
            assert f"refuses to start this {name}" in output and "clock-skew" in output
            assert "+20." in output or "+19." in output, output[-2000:]
