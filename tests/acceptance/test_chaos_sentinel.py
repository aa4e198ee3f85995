"""A failover under load: 2,000 payment jobs through a Redis Sentinel group, its
primary killed (``kill -9``) at a moment the seed picks, restarted a second later as a
supervisor would (the sentinels make it a replica of the new primary).

Publishes and the store's writes wait for one replica (``min_replicas=1``): a job whose
``.delay()`` returned is on two servers, so the failover cannot lose it, and a ledger
completion is too, so a job delivered again (a claim or an ack the new primary never
got) does not take effect twice. Counted in PostgreSQL, outside the failing Redis:
**0 lost acknowledged jobs, 0 duplicated effects**. The run also measures and prints
the time to recover: from the primary's death to the first job finished after the
sentinels named the new primary.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.acceptance.support_chaos import (
    APPLIED,
    DUPLICATED,
    Worker,
    chaos_seed,
    scalar,
    shop_database,
)
from tests.integration import support_sentinel as group_support
from tests.integration.test_sentinel import (
    applied_events,
    env_for,
    publish,
    published,
    stop,
    until_applied,
)

pytestmark = pytest.mark.chaos

JOBS = 2000
#: seconds the killed primary stays down before its supervisor restarts it
DOWN = 1.0
#: how long nothing may move before the run is declared over
STALL = 40.0


class Recovery(threading.Thread):
    """Notes when the first job finished after the new primary was named."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.promoted = threading.Event()
        self.first_after: float | None = None
        self._baseline = 0

    def promote(self) -> None:
        self._baseline = scalar(self.engine, APPLIED)
        self.promoted.set()

    def run(self) -> None:
        self.promoted.wait(120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if scalar(self.engine, APPLIED) > self._baseline:
                self.first_after = time.monotonic()
                return
            time.sleep(0.02)


def _settle(engine: Engine, wanted: set[str]) -> set[str]:
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


def test_a_failover_under_load_loses_no_acknowledged_job_and_duplicates_none(
    tmp_path: Path,
) -> None:
    seed = chaos_seed("sentinel-failover")
    rng = random.Random(seed)
    kill_at = rng.randint(JOBS // 10, JOBS // 3)  # jobs applied when the primary dies
    with group_support.sentinel_group() as group, shop_database(orders=JOBS) as engine:
        env = env_for(engine, 0, 1)
        workers = [Worker("tests.integration.support_sentinel", f"chaos-s{n}", "email", env,
                          tmp_path) for n in (1, 2)]  # fmt: skip
        publisher: subprocess.Popen[bytes] | None = None
        try:
            for worker in workers:
                worker.wait_ready()
            started = time.monotonic()
            # the publisher stops half-way until the primary is killed: the other half
            # goes out through the failover, however fast the workers are
            publisher = publish(env, JOBS, patience=90, hold=JOBS // 2, go=tmp_path / "go")
            until_applied(engine, publisher, kill_at)
            recovery = Recovery(engine)
            recovery.start()
            old, died = group.kill_primary()
            (tmp_path / "go").touch()
            new = group.wait_new_primary(old)
            named = time.monotonic()
            recovery.promote()
            time.sleep(max(0.0, DOWN - (named - died)))
            group.restart_as_replica(old)
            back = time.monotonic()
            answer = published(publisher)
            acknowledged = set(answer["acknowledged"])
            done = _settle(engine, acknowledged)
            recovery.join(5)
            lost = sorted(acknowledged - done)
            duplicated = scalar(engine, DUPLICATED)
            seconds = time.monotonic() - started
            recovered = None if recovery.first_after is None else recovery.first_after - died
            print(
                f"\nsentinel failover (seed {seed}): {JOBS} jobs, primary {old} killed at "
                f"{kill_at} applied; new primary {new} named after {named - died:.2f}s, old "
                f"one back as a replica after {back - died:.2f}s; first job finished after "
                f"the failover {recovered if recovered is None else round(recovered, 2)}s "
                f"after the kill; acknowledged {len(acknowledged)}, refused publishes "
                f"{answer['refusals']}, median publish {answer['median_ms']:.2f} ms; lost "
                f"{len(lost)}, duplicated {duplicated}; {seconds:.1f}s in all"
            )
            logs = "\n".join(w.output()[-3000:] for w in workers)
            assert len(acknowledged) == JOBS, answer["refusals"]
            assert not lost, f"lost {lost[:10]}\n{logs}"
            assert duplicated == 0
            assert recovered is not None
            assert all(worker.alive() for worker in workers), logs
        finally:
            if publisher is not None:
                stop(publisher)
            for worker in workers:
                worker.terminate(timeout=30)
            if os.environ.get("CC_KEEP_SENTINEL_LOGS"):
                print(tmp_path)
