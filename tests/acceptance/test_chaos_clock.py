"""One clock, proved with a fleet whose clocks are really wrong: real ``celery`` workers
under libfaketime (the monotonic clock real) at +20 s, -20 s, a correct one, and one whose
clock jumps five minutes ahead while it runs, through kill -9 of whole workers (each
replaced by a new one with the same clock), immediate jobs, countdowns and long jobs.

Measured, every time on the Redis server's clock (the correct one here; each run stamps
its start with it, :mod:`tests.acceptance.support_clock`):

* **delivered twice while alive**: a delivery of a job (each is stamped on the Redis
  clock as a worker receives it) after its first that neither follows the kill of a
  worker that had received it before, nor is a copy the layer published again (a
  deferral: its ``cc_due`` is later than the first delivery);
* **early runs**: a job whose first run started before the due time its publisher (a
  correct clock) wrote;
* **worst orphan time**: from each kill to each of the dead worker's messages (claimed,
  or in an inbox) back in its queue, against the documented bound (5/3 of
  ``recovery_timeout``).

A table per clock is printed with the seed (``CHAOS_SEED`` replays a run).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import redis

from tests.acceptance import support_clock as jobs
from tests.acceptance.support_chaos import (
    CHAOS_RECOVERY,
    ROOT,
    Worker,
    chaos_seed,
    own_redis,
    shop_database,
    worker_env,
)
from tests.acceptance.support_faketime import SkewedClock, launcher, require
from tests.acceptance.support_orphans import OrphanWatch

pytestmark = pytest.mark.chaos

BOUND = float(CHAOS_RECOVERY)
#: kill -> orphan back: the bound, a sweep period and a restore mutex left by a sweeper
#: killed mid-sweep (5/3 of the bound); +2: the watch's poll and the beat's period
DOCUMENTED_BOUND = BOUND * 5 / 3
#: clocks of the fleet (seconds ahead of Redis); "jump" starts right, then +300 s
CLOCKS = {"right": 0.0, "fast": 20.0, "slow": -20.0, "jump": 0.0}
JUMP = 300.0
JOBS, LONG = 240, 6


class Fleet:
    """One worker per clock, each killed one replaced with a new one on the same clock."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env, self.folder = env, folder
        self.clocks = {name: SkewedClock(folder, offset) for name, offset in CLOCKS.items()}
        self.live: dict[str, Worker] = {}
        self.all: list[tuple[str, Worker]] = []
        #: killed worker -> the Redis clock at its kill
        self.killed: dict[str, float] = {}

    def start(self, group: str) -> Worker:
        name = f"{group}-{len([g for g, _ in self.all if g == group]) + 1}"
        worker = Worker("tasks", name, "email", self.clocks[group].env(self.env), self.folder,
                        include="tests.acceptance.support_clock", launcher=launcher())  # fmt: skip
        self.all.append((group, worker))
        self.live[group] = worker.wait_ready()
        return worker

    def kill(self, group: str, watch: OrphanWatch) -> None:
        worker = self.live.pop(group)
        self.killed[worker.name] = watch.killed(worker.proc.pid, group).at
        worker.kill_all()

    def stop(self) -> None:
        for _, worker in self.all:
            worker.terminate(timeout=30)


def publish(env: dict[str, str], spec: list[tuple[str, float | None]]) -> dict[str, float]:
    """Publish one stamp job per ``(event, countdown)`` from a process with the correct
    clock; answers each event's due time (the Redis clock just before its publish, plus
    its countdown)."""
    code = (
        "import json, sys, redis; from tests.acceptance import support_clock as s; "
        "c = redis.Redis.from_url(sys.argv[1]); due = {}\n"
        "for event, countdown in json.loads(sys.argv[2]):\n"
        "    due[event] = s.redis_now(c) + (countdown or 0)\n"
        "    s.stamp_run.apply_async(kwargs={'event_id': event}, countdown=countdown)\n"
        "print(json.dumps(due))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, env["REDIS_URL"], json.dumps(spec)],
        cwd=ROOT, env=env, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace")
    return dict(json.loads(done.stdout.decode().splitlines()[-1]))


@pytest.mark.timeout(600)
def test_a_fleet_with_skewed_and_jumping_clocks_through_kill_nines_runs_nothing_early_or_twice(
    tmp_path: Path,
) -> None:
    require()
    seed = chaos_seed("clock-fleet")
    rng = random.Random(seed)
    (tmp_path / "redis").mkdir()
    with own_redis(tmp_path / "redis") as server, shop_database(1) as engine:
        env = worker_env(server, engine, CONVENTIONS_DOCTOR_LEVELS="clock-skew=warning")
        store = redis.Redis.from_url(server.url(1))
        fleet = Fleet(env, tmp_path)
        watch = OrphanWatch(server.url(0), BOUND / 3)
        try:
            for group in CLOCKS:
                fleet.start(group)
            events = [f"evt_{n:04d}" for n in range(1, JOBS + 1)]
            longs = events[:LONG]
            for event in longs:  # long jobs: they run until released, far beyond the bound
                store.set(jobs.HOLD + event, "1")
            spec = [(e, None if e in longs or rng.random() < 0.5 else round(rng.uniform(1, 15), 2))
                    for e in events]  # fmt: skip
            due = publish(env, spec)
            kills: Counter[str] = Counter()
            fleet.clocks["jump"].set(JUMP)  # the running worker's clock leaps ahead
            for group in rng.sample(list(CLOCKS), len(CLOCKS)):  # each clock's worker once
                time.sleep(rng.uniform(1.0, 3.0))
                fleet.kill(group, watch)
                kills[group] += 1
                fleet.start(group)
            time.sleep(BOUND)  # long jobs stay in flight through the sweeps of every clock
            for event in longs:
                store.set(jobs.RELEASE + event, "1")
            deadline = time.monotonic() + 120
            while not all(jobs.runs(store, e) for e in events):
                assert time.monotonic() < deadline, "jobs not run within 120 s"
                time.sleep(0.2)
            watch.settle(3 * DOCUMENTED_BOUND)
            table, totals = _measure(fleet, store, events, due, kills, watch)
        finally:
            watch.stop()
            fleet.stop()
            store.close()
    print(f"\nseed {seed}; documented orphan bound {DOCUMENTED_BOUND:.0f}s (recovery {BOUND:g}s)")
    print(f"{'clock':>20} {'kills':>5} {'twice alive':>11} {'early':>5} {'worst orphan':>12}")
    for row in table:
        print(f"{row[0]:>20} {row[1]:>5} {row[2]:>11} {row[3]:>5} {row[4]:>12}")
    print(f"orphans back: {watch.count('in-flight')} in flight, {watch.count('inbox')} from "
          f"inboxes; worst {watch.worst() or 0:.1f}s")  # fmt: skip
    assert totals["lost"] == 0, totals
    assert totals["twice_alive"] == 0, table
    assert totals["early"] == 0, table
    assert sum(kills.values()) == len(CLOCKS)
    assert watch.waits, "no orphan of the kills was seen"
    assert watch.never_back() == 0
    assert (watch.worst() or 0) <= DOCUMENTED_BOUND + 2, watch.waits


def _measure(  # noqa: PLR0917
    fleet: Fleet, store: redis.Redis, events: list[str], due: dict[str, float],
    kills: Counter[str], watch: OrphanWatch,
) -> tuple[list[tuple[str, int, int, int, str]], dict[str, int]]:  # fmt: skip
    group_of = {worker.name: group for group, worker in fleet.all}
    twice: Counter[str] = Counter()
    for deliveries in jobs.received(store).values():
        first = deliveries[0][0]
        for n, (at, _, cc_due) in enumerate(deliveries[1:], start=1):
            if cc_due and datetime.fromisoformat(cc_due).timestamp() > first:
                continue  # published again by the layer (a deferral), not redelivered
            before = {node.split("@", 1)[0] for _, node, _ in deliveries[:n]}
            if any(first <= fleet.killed.get(name, at + 1) <= at for name in before):
                continue  # a holder of it was killed before this delivery
            twice[group_of.get(deliveries[0][1].split("@", 1)[0], "?")] += 1
    early: Counter[str] = Counter()
    lost = 0
    for event in events:
        runs = jobs.runs(store, event)
        if not runs:
            lost += 1
            continue
        started, who, _ = min(runs)
        if started < due[event] - 0.005:
            early[group_of.get(str(who).split("@", 1)[0], "?")] += 1

    def worst(label: str | None) -> str:
        found = watch.worst(label=label)
        return "-" if found is None else f"{found:.1f}s"

    table = [
        (f"{name} {CLOCKS[name]:+g}s" + (f" then +{JUMP:g}s" if name == "jump" else ""),
         kills[name], twice[name], early[name], worst(name))
        for name in CLOCKS
    ]  # fmt: skip
    table.append(("all", sum(kills.values()), sum(twice.values()), sum(early.values()),
                  worst(None)))  # fmt: skip
    return table, {"lost": lost, "twice_alive": sum(twice.values()), "early": sum(early.values())}
