"""Durable time and recovery by liveness, through real workers on a Redis of the test's
own (``conventions.transport.delayed``, ``conventions.transport.liveness``):

* a two-hour countdown and a seven-day eta wait in the delayed set through a Redis crash
  (restarted from its AOF) and a restart of every worker, and run once, on time, when
  the workers' clock reaches them (``CONVENTIONS_CLOCK_OFFSET_SECONDS`` moves the movers'
  clock; a short real delay runs on the real clock);
* five kill -9 of a whole worker during a 2,000-job run with the default recovery bound
  (30 s): nothing lost, nothing applied twice, nothing stranded, and the time from each
  kill until each orphan was given back is measured (worst case printed);
* a job running ten times the recovery bound on a live worker is delivered once;
* jobs whose countdown is beyond the recovery bound (the old visibility timeout's
  scenario) run once each, never before their time, through a kill -9 while they wait.

Business effects are counted in the shop's database as in ``test_chaos.py``.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, text

from conventions.transport.layout import server_now
from conventions.transport.redis import in_inboxes
from tests.acceptance import support_clock as clock_jobs
from tests.acceptance.chaos_runs import Crew, run
from tests.acceptance.support_chaos import (
    CHAOS_RECOVERY,
    ROOT,
    RedisServer,
    Worker,
    chaos_seed,
    own_redis,
    publish_delayed,
    shop_database,
    worker_env,
)
from tests.acceptance.support_orphans import OrphanWatch

pytestmark = pytest.mark.chaos

#: the default recovery bound (seconds), measured in the kill -9 run
DEFAULT_RECOVERY = 30.0
#: what the bound allows from a kill to an orphan back in its queue: the bound, a sweep
#: period (a third of it) and a restore mutex left by a sweeper killed mid-sweep
DOCUMENTED_BOUND = DEFAULT_RECOVERY + DEFAULT_RECOVERY / 3 + DEFAULT_RECOVERY / 3
DELAYED = "_cc.delayed.email"


@pytest.fixture
def chaos_redis(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    with own_redis(folder) as server:
        yield server


def applied_at(engine: Engine, event_id: str) -> datetime | None:
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT applied_at FROM payment_events WHERE id = :id"), {"id": event_id}
        ).scalar_one()
    return found if found is None or found.tzinfo else found.replace(tzinfo=UTC)


def paid_times(engine: Engine, event_id: str) -> int:
    """How many times the event was applied (``paid_minor`` over its amount)."""
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT o.paid_minor / e.amount_minor FROM orders o JOIN payment_events e "
            "ON e.order_id = o.id WHERE e.id = :id"), {"id": event_id}).scalar_one())  # fmt: skip


def dues(broker: redis.Redis) -> dict[str, float]:
    """The due time of each payment job in the delayed set, by event id."""
    found = {}
    for member, score in broker.zrange(DELAYED, 0, -1, withscores=True):
        message = json.loads(member.decode().split("\n", 1)[1])
        found[json.loads(base64.b64decode(message["body"]))[1]["event_id"]] = score
    return found


def wait_until(check: object, timeout: float, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s")


def start(env: dict[str, str], folder: Path, names: list[str]) -> list[Worker]:
    workers = [Worker("tasks", name, "email", env, folder) for name in names]
    for worker in workers:
        worker.wait_ready()
    return workers


def stop(workers: list[Worker]) -> None:
    for worker in workers:
        worker.terminate(timeout=30)


@pytest.mark.timeout(240)
def test_a_two_hour_countdown_and_a_seven_day_eta_survive_a_redis_crash_and_a_fleet_restart(
    chaos_redis: RedisServer, tmp_path: Path
) -> None:
    with shop_database(3) as engine:
        env = worker_env(chaos_redis, engine)
        folder = tmp_path / "workers"
        folder.mkdir()
        broker = redis.Redis.from_url(chaos_redis.url(0))
        workers = start(env, folder, ["time-1", "time-2"])
        week = datetime.now(UTC) + timedelta(days=7)
        short = 25.0  # due after the crash and the restart below
        published = time.time()
        publish_delayed(env, [
            {"event_id": "evt_0001", "countdown": 7200},
            {"event_id": "evt_0002", "eta": week.isoformat()},
            {"event_id": "evt_0003", "countdown": short},
        ])  # fmt: skip
        scores = sorted(score for _, score in broker.zrange(DELAYED, 0, -1, withscores=True))
        assert len(scores) == 3 and broker.llen("email") == 0
        short_due, two_hours, seven_days = scores
        assert abs(two_hours - (published + 7200)) < 30
        assert seven_days == pytest.approx(week.timestamp())

        # a Redis crash (restarted from its AOF) and a restart of every worker
        stop(workers)
        chaos_redis.restart(signal.SIGKILL, down=1.0)
        workers = start(env, folder, ["time-3", "time-4"])
        assert broker.zcard(DELAYED) >= 2

        # the short one, on the real clock: once, on time, never before
        wait_until(lambda: applied_at(engine, "evt_0003") is not None, timeout=30)
        ran = applied_at(engine, "evt_0003")
        assert ran is not None
        late = ran.timestamp() - short_due
        print(f"\n{short:g} s countdown ran {late:+.2f}s from its due time")
        assert 0 <= late <= 2.0

        # the two-hour one: the workers' clock moves two hours on (less a few seconds)
        stop(workers)
        offset = two_hours - time.time() - 15  # due once the new workers are up
        later_env = {**env, "CONVENTIONS_CLOCK_OFFSET_SECONDS": f"{offset:.3f}"}
        workers = start(later_env, folder, ["time-5", "time-6"])
        expected = two_hours - offset  # the real moment its due time comes, by their clock
        wait_until(lambda: applied_at(engine, "evt_0001") is not None, timeout=30)
        ran = applied_at(engine, "evt_0001")
        assert ran is not None
        late = ran.timestamp() - expected
        print(f"2 h countdown ran {late:+.2f}s from its due time (workers' clock)")
        assert -0.1 <= late <= 2.0
        time.sleep(2)
        stop(workers)
        # once each; the seven-day one still waits, with its due time
        assert (paid_times(engine, "evt_0001"), paid_times(engine, "evt_0003")) == (1, 1)
        assert applied_at(engine, "evt_0002") is None
        [(_, score)] = broker.zrange(DELAYED, 0, -1, withscores=True)
        assert score == pytest.approx(week.timestamp())
        broker.close()


@pytest.mark.timeout(300)
def test_five_kill_nines_of_whole_workers_with_the_default_bound_lose_nothing_apply_once(
    chaos_redis: RedisServer, tmp_path: Path
) -> None:
    jobs = 2000
    watch = OrphanWatch(chaos_redis.url(0), DEFAULT_RECOVERY / 3)

    def kill_whole(crew: Crew, rng: random.Random) -> str:
        return crew.kill_nine(rng, whole=True, before=lambda w: watch.killed(w.proc.pid))

    seed = chaos_seed("kill-9-whole-default-bound")
    try:
        with shop_database(jobs) as engine:
            outcome = run(
                "kill -9 whole x5", "ours", chaos_redis, engine, tmp_path / "workers", jobs,
                [kill_whole] * 5, seed,
                env_extra={"CONVENTIONS_RECOVERY_TIMEOUT": str(DEFAULT_RECOVERY)},
            )  # fmt: skip
            watch.settle(2 * DOCUMENTED_BOUND)
    finally:
        watch.stop()
    print(f"\n{outcome}")
    waits = sorted(wait for _, wait, _ in watch.waits)
    if waits:
        print(f"orphans given back: {watch.count('in-flight')} claimed, {watch.count('inbox')} "
              f"from inboxes, after {statistics.median(waits):.1f}s median, {waits[-1]:.1f}s "
              f"worst on the Redis clock (bound {DOCUMENTED_BOUND:.0f}s)")  # fmt: skip
    assert outcome.chaos.count("kill -9") == 5, outcome.chaos
    assert (outcome.lost, outcome.duplicated, outcome.dead_letters) == (0, 0, 0), outcome
    with redis.Redis.from_url(chaos_redis.url(0)) as broker:  # nothing stranded anywhere
        held = (broker.llen("email"), broker.hlen("unacked"), in_inboxes(broker),
                broker.zcard(DELAYED))  # fmt: skip
    assert held == (0, 0, 0, 0), held
    # every kill of a busy worker leaves orphans: each seen, back, and within the bound
    assert waits, "no orphan of the five kills was seen: the bound was not measured"
    assert watch.never_back() == 0
    assert waits[-1] <= DOCUMENTED_BOUND + 2  # +2: the watch's poll and the beat period


@pytest.mark.timeout(180)
def test_a_job_ten_times_longer_than_the_recovery_bound_on_a_live_worker_runs_once(
    chaos_redis: RedisServer, tmp_path: Path
) -> None:
    """A 1,800 s job with the 30 s bound, scaled down: a 3 s bound and a 30 s job (the
    keeper's renewal does not depend on the ratio, only on beating every third)."""
    with shop_database(1) as engine:
        env = worker_env(chaos_redis, engine, CONVENTIONS_RECOVERY_TIMEOUT="3")
        folder = tmp_path / "workers"
        folder.mkdir()
        include = "tests.acceptance.support_crash"
        workers = [Worker("tasks", f"long-{n}", "email", env, folder, include=include)
                   for n in (1, 2)]  # fmt: skip
        for worker in workers:
            worker.wait_ready()
        broker, store = (
            redis.Redis.from_url(chaos_redis.url(0)),
            redis.Redis.from_url(chaos_redis.url(1)),
        )
        try:
            done = _publish_slow(env)
            runs = "test:slow-apply:runs:evt_0001"
            wait_until(lambda: store.get(runs) == b"1", timeout=30)
            started = time.monotonic()
            while time.monotonic() - started < 30:  # ten bounds: never given back
                assert broker.llen("email") == 0
                assert broker.hlen("unacked") == 1
                assert store.get(runs) == b"1"
                time.sleep(0.25)
            store.set("test:slow-apply:release:evt_0001", "1")
            wait_until(lambda: applied_at(engine, "evt_0001") is not None, timeout=30)
            wait_until(lambda: broker.hlen("unacked") == 0, timeout=30)
            assert store.get(runs) == b"1" and paid_times(engine, "evt_0001") == 1
            logs = "".join(w.output() for w in workers)
            assert logs.count("] received") == 1  # delivered once
            print(f"\na {time.monotonic() - started:.0f}s job with a 3 s bound: one delivery"
                  f" ({done})")  # fmt: skip
        finally:
            stop(workers)
            broker.close()
            store.close()


def _publish_slow(env: dict[str, str]) -> str:
    import subprocess
    import sys

    from tests.acceptance.support_chaos import ROOT

    code = ("from tests.acceptance.support_crash import slow_apply; "
            "print(slow_apply.delay(event_id='evt_0001').id)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          timeout=60, check=True)  # fmt: skip
    return done.stdout.decode().strip()


@pytest.mark.timeout(240)
def test_countdowns_beyond_the_recovery_bound_run_once_never_early_through_a_kill_nine(
    chaos_redis: RedisServer, tmp_path: Path
) -> None:
    jobs, bound = 100, 6.0
    with shop_database(jobs) as engine:
        env = worker_env(chaos_redis, engine, CONVENTIONS_RECOVERY_TIMEOUT=str(bound))
        folder = tmp_path / "workers"
        folder.mkdir()
        crew = Crew("ours", env, folder)
        crew.start(2)
        try:
            spec = [{"event_id": f"evt_{n:04d}", "countdown": 3 * bound + (n % 20) * 0.5}
                    for n in range(1, jobs + 1)]  # fmt: skip
            publish_delayed(env, spec)
            with redis.Redis.from_url(chaos_redis.url(0)) as broker:
                due = dues(broker)
            assert len(due) == jobs
            crew.kill_nine(random.Random(chaos_seed("countdown-beyond-bound")), whole=True)
            with engine.connect() as connection:
                count = "SELECT count(*) FROM payment_events WHERE applied_at IS NOT NULL"
                wait_until(lambda: connection.execute(text(count)).scalar_one() == jobs, 120)
        finally:
            for thread in crew.starting:
                thread.join(90)
            crew.stop()
        lateness = []
        for event_id, moment in due.items():
            ran = applied_at(engine, event_id)
            assert ran is not None and paid_times(engine, event_id) == 1, event_id
            lateness.append(ran.timestamp() - moment)
        lateness.sort()
        print(f"\n{jobs} countdowns of {3 * bound:g}-{3 * bound + 9.5:g}s through a kill -9: "
              f"{statistics.median(lateness):+.2f}s median, {lateness[-1]:+.2f}s worst "
              "from their due times")  # fmt: skip
        assert lateness[0] >= 0  # never before its time


@pytest.mark.timeout(180)
def test_a_worker_killed_holding_claimed_and_inbox_messages_has_each_back_within_the_bound(
    chaos_redis: RedisServer, tmp_path: Path
) -> None:
    """A worker runs a long job (claimed, in flight) with a slot free, so its fetch
    blocks in Redis; it is stopped (SIGSTOP: a paused machine), a job published then is
    moved by that fetch into its inbox, and it is killed -9. Each of the two is seen
    coming back, timed on the Redis clock from the moment it stopped."""
    bound = float(CHAOS_RECOVERY)
    with shop_database(1) as engine:
        env = worker_env(chaos_redis, engine)
        folder = tmp_path / "workers"
        folder.mkdir()
        broker, store = (
            redis.Redis.from_url(chaos_redis.url(0)),
            redis.Redis.from_url(chaos_redis.url(1)),
        )
        include = "tests.acceptance.support_clock"
        holder = Worker("tasks", "holder", "email", env, folder, include=include).wait_ready()
        workers = [holder]
        watch = OrphanWatch(chaos_redis.url(0), bound / 3)
        try:
            store.set(clock_jobs.HOLD + "evt_0001", "1")
            _publish_stamps(env, ["evt_0001"])
            wait_until(lambda: bool(clock_jobs.runs(store, "evt_0001")), 30)
            ready = _publisher_waiting(env, "evt_0002")  # publishes once told, at once
            os.killpg(holder.proc.pid, signal.SIGSTOP)
            stopped = server_now(broker)
            ready.communicate(b"go\n", timeout=30)  # its fetch (1 s blocks) is in flight
            wait_until(lambda: in_inboxes(broker) == 1, 10)
            workers.append(Worker("tasks", "other", "email", env, folder, include=include))
            workers[-1].wait_ready()
            kill = watch.killed(holder.proc.pid, at=stopped)
            holder.kill_all()
            assert len(kill.inboxes) == 1
            watch.settle(3 * bound)
            store.set(clock_jobs.RELEASE + "evt_0001", "1")
            wait_until(lambda: all(
                clock_jobs.runs(store, e) and clock_jobs.runs(store, e)[-1][2] is not None
                for e in ("evt_0001", "evt_0002")), timeout=60)  # fmt: skip
        finally:
            watch.stop()
            for worker in workers:
                worker.terminate(timeout=30)
            broker.close()
            store.close()
    documented = bound * 5 / 3
    print(f"\nback after a stop and kill -9: {sorted((k, round(w, 2)) for k, w, _ in watch.waits)}"
          f" (bound {documented:g}s, Redis clock)")  # fmt: skip
    assert (watch.count("in-flight"), watch.count("inbox")) == (1, 1)
    assert watch.never_back() == 0
    assert (watch.worst() or 0) <= documented + 2


def _publisher_waiting(env: dict[str, str], event: str) -> subprocess.Popen[bytes]:
    """A publisher process, imported and connected, that publishes ``event``'s stamp job
    when a line arrives on its standard input (a publish within milliseconds)."""
    code = ("import sys; from tests.acceptance.support_clock import stamp_run, app\n"
            "app.connection_for_write().ensure_connection(); print('ready', flush=True)\n"
            "sys.stdin.readline(); stamp_run.delay(event_id=sys.argv[1])")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code, event], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def _publish_stamps(env: dict[str, str], events: list[str]) -> None:
    code = ("import sys; from tests.acceptance.support_clock import stamp_run\n"
            "for e in sys.argv[1:]: stamp_run.delay(event_id=e)")  # fmt: skip
    subprocess.run([sys.executable, "-c", code, *events], cwd=ROOT, env=env,
                   capture_output=True, timeout=60, check=True)  # fmt: skip
