"""The chaos run on RabbitMQ: 2,000 payments through five kill -9 and a broker restart,
then a crash pill, counted in the database.

The broker is a RabbitMQ node of the test's own (:mod:`tests.acceptance.rabbit_node`):
the machine's node is shared, and this test stops its broker. The app is built from
``reliable(broker_url="amqp://...")`` (:mod:`tests.acceptance.support_rabbit_chaos`), its
store and results on a Redis server of the test's own, the effect in a fresh PostgreSQL
database: one ``testing.cc_chaos_pay.v1`` job per payment event, whose body applies the
event to its order under a ``once()`` marker. Two prefork workers serve it; a worker
killed is replaced at once (``chaos_runs.Crew``).

While the work is under way the plan (shuffled by the printed seed) deals five kill -9,
two whole workers (main process and pool) and three pool processes, and one restart of
the whole broker node. At the end two numbers are counted in the database: **lost** (an
event never applied) and **duplicated** (an extra application): 0 and 0, and no dead
letter. Then a crash pill (a job that SIGKILLs the pool process running it, on every
delivery) must end as a ``poison`` dead letter within the delivery limit, while the
workers keep serving.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import Engine

from conventions.config import settings
from conventions.store import Store, open_store
from conventions.store.records import Category, DeadLetter
from tests.acceptance import chaos_report, rabbit_node
from tests.acceptance import support_rabbit_chaos as rc
from tests.acceptance.chaos_runs import LOG_TAIL, Crew, wait_applied
from tests.acceptance.rabbit_node import RabbitNode
from tests.acceptance.support_chaos import (
    APPLIED,
    ROOT,
    Outcome,
    RedisServer,
    chaos_seed,
    measure,
    own_redis,
    scalar,
    shop_database,
)
from tests.fixtures import unavailable

pytestmark = pytest.mark.chaos

JOBS = 2000
WHOLE_WORKERS_KILLED = 2
POOL_PROCESSES_KILLED = 3
#: nothing moved this long (seconds): the run is over (a stranded message never comes back)
STALL = 30.0
#: the longest the 2,000 jobs may take, blows and restart included (seconds)
DEADLINE = 300.0
#: where this run's report goes (the Redis suite writes build/chaos-report.md)
REPORT = ROOT / "build" / "chaos-report-rabbitmq.md"

Blow = Callable[[Crew, random.Random], str]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RabbitNode]:
    if not rabbit_node.installed():
        unavailable("rabbitmq-server (a node of the test's own)", FileNotFoundError("rabbitmq"))
    folder = tmp_path / "rabbit"
    folder.mkdir()
    with rabbit_node.private_node(folder) as started:
        yield started


@pytest.fixture
def chaos_redis(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    with own_redis(folder) as server:
        yield server


@pytest.fixture
def shop() -> Iterator[Engine]:
    with shop_database(JOBS) as engine:
        yield engine


def plan(node: RabbitNode, seed: int) -> list[Blow]:
    """Five kill -9 and one broker restart, in the seed's order."""

    def restart_broker(crew: Crew, rng: random.Random) -> str:
        down = rng.uniform(1.0, 3.0)
        started = time.monotonic()
        node.restart(down=down)
        return f"RabbitMQ node restarted ({time.monotonic() - started:.1f}s down and up)"

    blows: list[Blow] = [
        *[partial(Crew.kill_nine, whole=True)] * WHOLE_WORKERS_KILLED,
        *[partial(Crew.kill_nine, whole=False)] * POOL_PROCESSES_KILLED,
        restart_broker,
    ]
    random.Random(seed).shuffle(blows)
    return blows


def held(node: RabbitNode) -> int | None:
    """Messages the broker holds for the app (ready or unacked, delays and dead letters
    included); None while it does not answer (restarting)."""
    try:
        queues = node.queues()
    except (RuntimeError, subprocess.TimeoutExpired):
        return None
    return sum(
        q.messages for q in queues.values()
        if q.name in (rc.QUEUE, rc.POISON_QUEUE) or q.name.startswith("celery_delayed_")
    )  # fmt: skip


def settle(node: RabbitNode, engine: Engine, deadline: float) -> None:
    """Until every job took effect and the broker holds nothing, or nothing moved for
    ``STALL`` seconds, or the deadline."""
    last: tuple[int, int | None] = (-1, None)
    moved = time.monotonic()
    while time.monotonic() < deadline:
        state = (scalar(engine, APPLIED), held(node))
        if state == (JOBS, 0):
            return
        if state != last:
            last, moved = state, time.monotonic()
        elif time.monotonic() - moved > STALL:
            return
        time.sleep(1.0)


def diagnosis(node: RabbitNode, crew: Crew, store: Store) -> str:
    """What the broker and the store hold, and each worker's last lines."""
    lines = [f"\n--- diagnosis: the broker ({node.url}) ---"]
    try:
        lines += [f"{q.name}: {q.ready} ready, {q.unacked} unacked, {q.consumers} consumers"
                  for q in node.queues().values()]  # fmt: skip
    except RuntimeError as exc:
        lines.append(f"the broker did not answer: {exc}")
    lines.append("--- dead letters (first 10) ---")
    lines += [f"{r.task_id} {r.category} {r.message[:160]}"
              for r in store.list_dead_letters(limit=10)]  # fmt: skip
    for worker in crew.all:
        state = "alive" if worker.alive() else f"exited {worker.proc.returncode}"
        tail = worker.output().splitlines()[-LOG_TAIL:]
        lines += [f"--- {worker.name} ({state}), last {len(tail)} lines ---", *tail]
    return "\n".join(lines)


def _run(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tests.acceptance.support_rabbit_chaos", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def _dead_letter(store: Store, task_id: str) -> DeadLetter | None:
    found = [r for r in store.list_dead_letters(limit=1000) if r.task_id == task_id]
    return found[0] if found else None


def _report(outcome: Outcome) -> None:
    table = chaos_report.markdown([outcome])
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(
        "# Chaos report: RabbitMQ\n\nGenerated by "
        "`pytest -m chaos tests/acceptance/test_chaos_rabbitmq.py`.\n\n" + table
    )
    print(f"\n{outcome}\nchaos report ({REPORT.relative_to(ROOT)}):\n{table}")


def _poison_pill(env: dict[str, str], crew: Crew, store: Store) -> None:
    """A job that kills its pool process on every delivery ends as ``poison``, within the
    delivery limit, and the workers keep serving."""
    started, deaths_before = time.monotonic(), _pool_deaths(crew)
    pill_id = _run(["pill", f"pill-{int(started)}"], env, timeout=60)
    deadline = started + 120
    record = None
    while record is None and time.monotonic() < deadline:
        record = _dead_letter(store, pill_id)
        time.sleep(0.5)
    kills = _pool_deaths(crew) - deaths_before
    limit = settings.delivery_limit(rc.app.conf)
    print(
        f"crash pill {pill_id}: {record.category if record else 'no record'} after {kills} "
        f"pool process deaths, {time.monotonic() - started:.1f}s (delivery limit {limit}, "
        f"quarantined at claim {rc.MAX_DELIVERIES + 1}): {record.message if record else ''}"
    )
    assert record is not None, diagnosis_text(crew, store)
    assert record.category is Category.POISON, record
    assert 1 <= kills <= limit, (kills, limit)
    assert all(worker.alive() for worker in crew.live), "a worker died of the pill"


def _pool_deaths(crew: Crew) -> int:
    """Pool processes the workers saw killed so far (Celery logs each one)."""
    return sum(worker.output().count("exited with 'signal 9 (SIGKILL)'") for worker in crew.all)


def diagnosis_text(crew: Crew, store: Store) -> str:
    tails = [f"--- {w.name} ---\n" + "\n".join(w.output().splitlines()[-LOG_TAIL:])
             for w in crew.all]  # fmt: skip
    return "\n".join([f"dead letters: {store.count_dead_letters()}", *tails])


@pytest.mark.timeout(600)
def test_two_thousand_payments_through_kill_nines_and_a_broker_restart_lose_nothing(
    node: RabbitNode, chaos_redis: RedisServer, shop: Engine, tmp_path: Path
) -> None:
    seed = chaos_seed("rabbitmq-kill-9-restart")
    rng = random.Random(seed)
    env = rc.env_for(node.url, chaos_redis, shop)
    folder = tmp_path / "workers"
    folder.mkdir()
    crew = rc.RabbitCrew(env, folder)
    store = open_store(chaos_redis.url(1))
    done: list[str] = []
    started = time.monotonic()
    try:
        crew.start(2)
        assert _run(["publish", str(JOBS)], env) == f"published {JOBS}"
        wait_applied(shop, JOBS // 20)
        for blow in plan(node, seed):
            applied = scalar(shop, APPLIED)  # the blows land while the work is under way
            done.append(f"{blow(crew, rng)} (at {applied} applied)")
            time.sleep(rng.uniform(0.3, 2.0))
        for thread in crew.starting:
            thread.join(90)
        settle(node, shop, started + DEADLINE)
        counts = measure(shop, receipts=False)
        kind = node.queue_type(rc.QUEUE)
        outcome = Outcome(
            scenario=f"kill -9 + broker restart (RabbitMQ, {kind} queue)",
            profile="ours",
            jobs=JOBS,
            seconds=round(time.monotonic() - started, 1),
            chaos="; ".join(done),
            dead_letters=store.count_dead_letters(),
            **counts,
        )
        _report(outcome)
        if outcome.lost or outcome.duplicated or outcome.dead_letters:
            print(diagnosis(node, crew, store))
        assert sum("kill -9" in blow for blow in done) == 5, done
        assert node.restarts == 1
        assert (outcome.lost, outcome.duplicated, outcome.dead_letters) == (0, 0, 0), outcome
        _poison_pill(env, crew, store)
    finally:
        crew.stop()
        store.close()
