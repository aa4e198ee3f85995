"""A master of the store's Redis Cluster killed under load: 2,000 payment jobs of the
reference app (``tasks``, unchanged) whose store is a cluster of three masters and three
replicas (ports 7110-7115, the run's own), its broker a Redis of its own. A master picked
by the seed is killed (``kill -9``) at a moment the seed picks; its replica is promoted
by the cluster, and the killed node comes back a moment later as a replica (as a
supervisor would bring it back).

The store's writes wait for one replica (``?min_replicas=1``): a reservation, a claim or
a completion that was acknowledged is on two nodes, so the promotion keeps it. Counted in
PostgreSQL, outside the failing cluster: **0 lost acknowledged jobs, 0 duplicated
effects**, and every ``.delay()`` during the failover returned or raised
``BackendUnavailable`` (the publisher fails on any other exception).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.support_chaos import (
    DUPLICATED,
    ROOT,
    Worker,
    chaos_seed,
    own_redis,
    scalar,
    shop_database,
    worker_env,
)
from tests.integration import support_cluster
from tests.integration.test_sentinel import applied_events, stop, until_applied
from tests.isolation import fixed

pytestmark = pytest.mark.chaos

JOBS = 2000
#: the chaos cluster: three masters, three replicas
PORTS = tuple(fixed(port) for port in range(7110, 7116))
#: seconds the killed master stays down before it is started again
DOWN = 3.0
#: how long nothing may move before the run is declared over
STALL = 60.0


def _settle(engine: Any, wanted: set[str]) -> set[str]:
    last, moved = -1, time.monotonic()
    while True:
        done = applied_events(engine)
        if wanted <= done:
            return done
        if len(done) != last:
            last, moved = len(done), time.monotonic()
        elif time.monotonic() - moved > STALL:
            return done
        time.sleep(0.5)


def _published(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return answer


def test_a_store_master_killed_under_load_loses_no_acknowledged_job_and_duplicates_none(
    tmp_path: Path,
) -> None:
    seed = chaos_seed("cluster-master-kill")
    rng = random.Random(seed)
    kill_at = rng.randint(JOBS // 10, JOBS // 3)  # jobs applied when the master dies
    cluster = support_cluster.Cluster(PORTS, replicas=1).start()
    try:
        with own_redis(tmp_path) as broker, shop_database(orders=JOBS) as engine:
            store_url = support_cluster.url(PORTS[:3], "min_replicas=1&replica_wait_ms=1000")
            env = worker_env(broker, engine, CONVENTIONS_STORE_URL=store_url)
            workers = [Worker("tasks", f"chaos-c{n}", "email", env, tmp_path) for n in (1, 2)]
            publisher: subprocess.Popen[bytes] | None = None
            try:
                for worker in workers:
                    worker.wait_ready()
                started = time.monotonic()
                # the publisher stops half-way until the master is killed: the other
                # half goes out through the failover, however fast the workers are
                go = tmp_path / "go"
                publisher = subprocess.Popen(
                    [sys.executable, "-m", "tests.acceptance.support_cluster_chaos",
                     str(JOBS), "120", str(JOBS // 2), str(go)],
                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                )  # fmt: skip
                until_applied(engine, publisher, kill_at)
                victim = rng.choice(sorted(cluster.masters()))
                cluster.kill(victim)
                died = time.monotonic()
                go.touch()
                cluster.wait_ok(timeout=60)
                promoted = time.monotonic()
                time.sleep(max(0.0, DOWN - (promoted - died)))
                support_cluster.restart(cluster, victim)
                answer = _published(publisher)
                acknowledged = set(answer["acknowledged"])
                done = _settle(engine, acknowledged)
                lost = sorted(acknowledged - done)
                duplicated = scalar(engine, DUPLICATED)
                print(
                    f"\ncluster master kill (seed {seed}): {JOBS} jobs, master {victim} "
                    f"killed at {kill_at} applied; cluster ok again after "
                    f"{promoted - died:.2f}s; acknowledged {len(acknowledged)}, refused "
                    f"publishes {answer['refusals']}, median publish "
                    f"{answer['median_ms']:.2f} ms; lost {len(lost)}, duplicated "
                    f"{duplicated}; {time.monotonic() - started:.1f}s in all"
                )
                logs = "\n".join(w.output()[-3000:] for w in workers)
                assert len(acknowledged) == JOBS, answer["refusals"]
                assert not lost, f"lost {lost[:10]}\n{logs}"
                assert duplicated == 0
                assert all(worker.alive() for worker in workers), logs
            finally:
                if publisher is not None:
                    stop(publisher)
                for worker in workers:
                    worker.terminate(timeout=30)
    finally:
        cluster.stop()
