"""Each release gives back the jobs of the other's killed worker, on Redis.

The mixed-fleet run (``test_chaos_fleet.py``) kills workers while both releases have
live workers, so either may be the one that recovers. Here the survivor is always of the
other release: one old and one new worker serve the fleet project under load; the new
one is killed whole (main process and pool, ``kill -9``) and not replaced, so the old one
alone must find it dead (its liveness score in the past) and give back what it held
(its inboxes, and its unacknowledged jobs, which nobody renews any more); then a new
worker starts, the old one is killed whole, and the new one alone must do the same for
it. The count at the end: 0 lost, 0 duplicated, 0 stranded, no dead letter.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu.utils.encoding import bytes_to_str

from conventions.transport import layout
from tests.acceptance.chaos_runs import wait_applied
from tests.acceptance.releases import PREVIOUS
from tests.acceptance.support_chaos import (
    APPLIED,
    RedisServer,
    Worker,
    chaos_seed,
    measure,
    own_redis,
    scalar,
    shop_database,
)
from tests.acceptance.support_fleet import (
    KINDS,
    FleetCrew,
    Servers,
    dead_letters,
    publish,
    published,
    settle,
    stranded_on_redis,
    who_ran,
)
from tests.acceptance.support_release import HEAD, Runtime, release_runtime

pytestmark = pytest.mark.chaos

JOBS = 800
#: the longest a survivor may take to find the killed worker dead and give its jobs
#: back: the recovery bound (6 s in these runs) and a sweep, with room for a loaded box
RECOVERED_WITHIN = 90.0


@pytest.fixture(scope="module")
def runtimes() -> dict[str, Runtime]:
    return {"old": release_runtime(PREVIOUS), "new": HEAD}


@pytest.fixture
def chaos_redis(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    with own_redis(folder) as server:
        yield server


def consumers_of(client: redis.Redis, worker: Worker) -> list[str]:
    """The transport's consumer ids of ``worker`` (its main process's pid)."""
    found = []
    for raw in client.zrange(layout.CONSUMERS, 0, -1):
        consumer = bytes_to_str(raw)
        pid = client.hget(layout.CONSUMER.format(consumer=consumer), "pid")
        if pid is not None and int(pid) == worker.proc.pid:
            found.append(consumer)
    return found


def given_back(client: redis.Redis, consumers: list[str]) -> bool:
    """Whether a sweep found each consumer dead with its inboxes empty (or forgot it)."""
    dead = {bytes_to_str(c) for c in client.hkeys(layout.DEAD_SINCE)}
    listed = {bytes_to_str(c) for c in client.zrange(layout.CONSUMERS, 0, -1)}
    return all(c in dead or c not in listed for c in consumers)


def kill_alone(crew: FleetCrew, victim_kind: str, client: redis.Redis) -> str:
    """Kill the live worker of ``victim_kind`` whole, unreplaced; wait until the other
    release's worker, the only one left, has given back what it held."""
    (victim,) = [w for w in crew.live if crew.kind[w.name] == victim_kind]
    consumers = consumers_of(client, victim)
    assert consumers, f"{victim.name} has no consumer in {layout.CONSUMERS}"
    held = sum(
        int(client.llen(inbox)) for inbox in client.hkeys(layout.INBOXES)
        if bytes_to_str(inbox).startswith(tuple(f"_cc.inbox.{c}:" for c in consumers))
    )  # fmt: skip
    unacked = int(client.hlen("unacked"))  # the fleet's: a message names no holder
    with crew.lock:
        crew.target[victim_kind] = 0
        crew.live.remove(victim)
    victim.kill_all()
    killed = time.monotonic()
    while not given_back(client, consumers):
        assert time.monotonic() - killed < RECOVERED_WITHIN, (
            f"{victim.name}'s jobs were not given back by the {crew.live_kinds()} left"
        )
        time.sleep(0.2)
    return (
        f"kill -9 {victim.name} alone ({held} in its inboxes, {unacked} unacked in the "
        f"fleet): found dead by the other release in {time.monotonic() - killed:.1f}s"
    )


@pytest.mark.timeout(360)
def test_each_release_gives_back_the_jobs_of_the_others_killed_worker(
    runtimes: dict[str, Runtime], chaos_redis: RedisServer, tmp_path: Path
) -> None:
    chaos_seed("fleet-recovery")  # no random blow here: printed for the suite's habit
    folder = tmp_path / "workers"
    folder.mkdir()
    with shop_database(JOBS) as engine:
        servers = Servers(chaos_redis.url(0), chaos_redis.url(1), engine)
        crew = FleetCrew(runtimes, servers, folder, {"old": 1, "new": 1})
        client = redis.Redis.from_url(servers.broker_url)
        steps: list[str] = []
        try:
            crew.start()
            publishers = [publish(runtimes[k], servers, k, JOBS, 10) for k in KINDS]
            wait_applied(engine, JOBS // 10)
            steps.append(kill_alone(crew, "new", client))  # the old worker recovers it
            crew.target["new"] = 1
            crew.start(1)  # a new worker, then the old one dies alone
            wait_applied(engine, scalar(engine, APPLIED) + JOBS // 10)
            steps.append(kill_alone(crew, "old", client))  # the new worker recovers it
            steps += [published(p) for p in publishers]
            settle(engine, JOBS, lambda: sum(stranded_on_redis(servers.broker_url).values()),
                   time.monotonic() + 150)  # fmt: skip
        finally:
            crew.stop()
            client.close()
        counts = measure(engine, receipts=False)
        left = stranded_on_redis(servers.broker_url)
    print("\n" + "\n".join(steps) + f"\n{counts} left {left} ran {who_ran(servers.store_url)}")
    assert (counts["lost"], counts["duplicated"], sum(left.values())) == (0, 0, 0), (counts, left)
    assert dead_letters(servers.store_url) == 0
