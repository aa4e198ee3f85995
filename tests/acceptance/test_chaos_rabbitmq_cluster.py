"""The chaos runs on a 3-node RabbitMQ cluster: 2,000 payments through the kill -9 of the
node holding the queue's leader and then of a follower's, and (a run of its own) through
a partition of the node the consumers are connected to, counted in the database.

The cluster is the test's own (:mod:`tests.acceptance.rabbit_cluster`: three nodes on
loopback, quorum queues of three members, leaders spread). The app is the RabbitMQ chaos
app (:mod:`tests.acceptance.support_rabbit_chaos`) given the failover list of the three
nodes' URLs; two prefork workers serve it. A publisher sends the 2,000 jobs one by one
while the nodes die (200 of them with a countdown of 10 to 60 s: they wait in the
``celery_delayed_*`` quorum queues through the blows); a ``.delay()`` that raises is said
and made again, as a caller told of a refusal would: a publish that returned was
confirmed, and must take effect.

What the broker holds counts the delay queues' dead-letter outboxes too: messages a delay
queue dead-lettered and keeps until their target confirms them (at-least-once), which
``rabbitmqctl list_queues`` does not count. A confirm lost with a killed leader leaves
them there until ``dead_letter_worker_publisher_confirm_timeout`` (15 s on the test's
cluster, 180 s by default): uncounted, a run once took 13 of them for lost.

The first run: kill -9 of the node holding ``cc_chaos_payments``' leader (a new leader is
elected among the two others), the node started again; kill -9 of a node holding one of
its followers, started again. Then: 0 lost, 0 duplicated, no dead letter, every queue of
the app (poison queue and delay queues included) with its three members online, and a
crash pill ends as ``poison`` (the poison queue survived the node's loss).

The second: SIGSTOP of the first node of the list (the consumers' and the publisher's)
for longer than the net tick time (its peers declare it down: a partition, seen from
them), then SIGCONT. On RabbitMQ 3.10.8 jobs are stranded (the deliveries the workers held
stay unacked, or the consumers get nothing more): none run twice, but the run does not
finish, hence ``xfail`` (see its reason).
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from conventions.store import open_store
from tests.acceptance import chaos_report, rabbit_node
from tests.acceptance import support_rabbit_chaos as rc
from tests.acceptance.chaos_runs import wait_applied
from tests.acceptance.rabbit_cluster import NET_TICKTIME, RabbitCluster, private_cluster
from tests.acceptance.rabbit_node import Queue
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
from tests.acceptance.test_chaos_rabbitmq import _poison_pill, diagnosis, settle
from tests.fixtures import unavailable

pytestmark = pytest.mark.chaos

JOBS = 2000
#: jobs published with a countdown (they wait in the delay queues through the blows)
DELAYED = 200
#: the longest the 2,000 jobs may take, blows included (seconds)
DEADLINE = 420.0
#: seconds between two publishes: the 2,000 take about a minute, through the blows
PACE = 0.03
#: where this run's report goes
REPORT = ROOT / "build" / "chaos-report-rabbitmq-cluster.md"
#: the longest a queue may take to have its three members online again (seconds)
REJOIN = 120.0


class Cluster:
    """The cluster seen as one node by the RabbitMQ chaos test's helpers (``settle``,
    ``diagnosis``): whichever node is up answers ``list_queues``."""

    def __init__(self, cluster: RabbitCluster) -> None:
        self.cluster = cluster
        self.url = cluster.url

    def queues(self) -> dict[str, Queue]:
        """Every queue, and each quorum queue's dead-letter outbox as a queue of its own
        (``<name> (dead-lettered, unconfirmed)``, ready): messages it still holds."""
        found = self.cluster.any_up().queues()
        for name, count in self.cluster.dead_lettered().items():
            if count > 0:
                outbox = f"{name} (dead-lettered, unconfirmed)"
                found[outbox] = Queue(outbox, count, 0, 0)
        return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RabbitCluster]:
    if not rabbit_node.installed():
        unavailable("rabbitmq-server (a cluster of the test's own)", FileNotFoundError("rabbitmq"))
    folder = tmp_path / "rabbit"
    folder.mkdir()
    with private_cluster(folder) as started:
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


def _wait_members(cluster: RabbitCluster, names: set[str]) -> None:
    """Until every queue of ``names`` has a leader and its three members online."""
    deadline, last = time.monotonic() + REJOIN, {}
    while time.monotonic() < deadline:
        try:
            last = {n: m for n, m in cluster.memberships().items() if n in names}
        except (RuntimeError, subprocess.TimeoutExpired):
            last = {}
        if set(last) == names and all(len(m.online) == 3 and m.leader for m in last.values()):
            return
        time.sleep(1.0)
    raise AssertionError(f"the queues did not get their three members back: {last}")


def _app_queues(cluster: RabbitCluster) -> set[str]:
    return {n for n in cluster.memberships()
            if n in (rc.QUEUE, rc.POISON_QUEUE) or n.startswith("celery_delayed_")}  # fmt: skip


def _report(outcome: Outcome) -> None:
    table = chaos_report.markdown([outcome])
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(
        "# Chaos report: RabbitMQ cluster\n\nGenerated by "
        "`pytest -m chaos tests/acceptance/test_chaos_rabbitmq_cluster.py`.\n\n" + table
    )
    print(f"\n{outcome}\nchaos report ({REPORT.relative_to(ROOT)}):\n{table}")


def _publishing(publisher: subprocess.Popen[str]) -> str:
    return "publisher under way" if publisher.poll() is None else "publisher done"


def _blows(
    cluster: RabbitCluster, shop: Engine, rng: random.Random, publisher: subprocess.Popen[str]
) -> list[str]:
    """Kill -9 the leader's node, then a follower's, each started again."""
    done: list[str] = []
    names = _app_queues(cluster)
    leader = cluster.memberships()[rc.QUEUE].leader
    victim = cluster.node(leader)
    waiting = _delayed(cluster)
    victim.kill_nine()
    new = _new_leader(cluster, leader)
    at = scalar(shop, APPLIED)
    done.append(f"kill -9 of the leader's node {leader} (at {at} applied, {waiting} delayed "
                f"waiting, {_publishing(publisher)}; new leader {new})")  # fmt: skip
    time.sleep(rng.uniform(1.0, 4.0))  # work goes on on two nodes
    victim.start()
    _wait_members(cluster, names)
    membership = cluster.memberships()[rc.QUEUE]
    follower = rng.choice([m for m in membership.members if m != membership.leader])
    cluster.node(follower).kill_nine()
    done.append(f"kill -9 of the follower's node {follower} (at {scalar(shop, APPLIED)} "
                f"applied, {_publishing(publisher)})")  # fmt: skip
    time.sleep(rng.uniform(1.0, 4.0))
    cluster.node(follower).start()
    _wait_members(cluster, names)
    return done


def _pause(
    cluster: RabbitCluster, shop: Engine, rng: random.Random, publisher: subprocess.Popen[str]
) -> list[str]:
    """SIGSTOP the first node of the failover list (the one the workers and the
    publisher connect to while it is up) longer than the net tick time, then SIGCONT."""
    paused = cluster.nodes[0]
    seconds = NET_TICKTIME * 2 + rng.uniform(0, 4)
    at = scalar(shop, APPLIED)
    paused.pause(seconds)
    done = [f"{paused.name} (the consumers' node) paused {seconds:.0f}s (net tick time "
            f"{NET_TICKTIME}s; at {at} applied, {_publishing(publisher)})"]  # fmt: skip
    _wait_members(cluster, _app_queues(cluster))
    return done


def _delayed(cluster: RabbitCluster) -> int:
    """Messages waiting in the ``celery_delayed_*`` queues (countdowns not yet due, and
    dead-lettered ones not yet confirmed by their next queue)."""
    queues = Cluster(cluster).queues().values()
    return sum(q.messages for q in queues if q.name.startswith("celery_delayed_"))


def _new_leader(cluster: RabbitCluster, old: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            leader = cluster.memberships()[rc.QUEUE].leader
        except (RuntimeError, subprocess.TimeoutExpired, KeyError):
            leader = ""
        if leader and leader != old:
            return leader
        time.sleep(0.5)
    raise AssertionError(f"no new leader was elected after {old} died")


Blows = Callable[[RabbitCluster, Engine, random.Random, "subprocess.Popen[str]"], list[str]]


@pytest.mark.timeout(900)
def test_two_thousand_payments_through_the_kill_nine_of_the_leader_and_a_follower_lose_nothing(
    cluster: RabbitCluster, chaos_redis: RedisServer, shop: Engine, tmp_path: Path
) -> None:
    _chaos(cluster, chaos_redis, shop, tmp_path, "rabbitmq-cluster", _blows,
           "leader's and follower's nodes killed (RabbitMQ 3-node cluster)")  # fmt: skip


@pytest.mark.xfail(
    reason="RabbitMQ 3.10.8 (this machine's): after a node the workers consume from is "
    "paused past the net tick time, the deliveries they held stay unacked and never come "
    "back, or the consumers get nothing more (likely rabbitmq/rabbitmq-server#14589, fixed "
    "in 4.2): jobs stranded in the queue, none run twice",
    strict=False,
)
@pytest.mark.timeout(900)
def test_two_thousand_payments_through_a_partition_of_the_consumers_node_lose_nothing(
    cluster: RabbitCluster, chaos_redis: RedisServer, shop: Engine, tmp_path: Path
) -> None:
    _chaos(cluster, chaos_redis, shop, tmp_path, "rabbitmq-cluster-partition", _pause,
           "the consumers' node paused past the net tick (RabbitMQ 3-node cluster)")  # fmt: skip


def _chaos(  # noqa: PLR0917
    cluster: RabbitCluster, chaos_redis: RedisServer, shop: Engine, tmp_path: Path,
    run: str, blows: Blows, scenario: str,
) -> None:  # fmt: skip
    seed = chaos_seed(run)
    rng = random.Random(seed)
    env = rc.env_for(cluster.url, chaos_redis, shop)
    folder = tmp_path / "workers"
    folder.mkdir()
    crew = rc.RabbitCrew(env, folder)
    store = open_store(chaos_redis.url(1))
    seen = Cluster(cluster)
    started = time.monotonic()
    publisher = subprocess.Popen(
        [sys.executable, "-m", "tests.acceptance.support_rabbit_chaos", "publish-through",
         str(JOBS), str(DELAYED), str(PACE)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        crew.start(2)
        wait_applied(shop, JOBS // 20)
        members = cluster.memberships()[rc.QUEUE]
        assert len(members.members) == 3, members
        assert publisher.poll() is None, "the publisher ended before the first blow"
        done = blows(cluster, shop, rng, publisher)
        said, _ = publisher.communicate(timeout=DEADLINE)
        settle(seen, shop, started + DEADLINE)  # type: ignore[arg-type]
        counts = measure(shop, receipts=False)
        outcome = Outcome(
            scenario=scenario,
            profile="ours",
            jobs=JOBS,
            seconds=round(time.monotonic() - started, 1),
            chaos="; ".join(done),
            dead_letters=store.count_dead_letters(),
            **counts,
        )
        _report(outcome)
        refused = [line for line in said.splitlines() if line.startswith("refused")]
        print(f"publisher: {said.splitlines()[-1]}; refusals: {refused[:5]}")
        if outcome.lost or outcome.duplicated or outcome.dead_letters:
            print(diagnosis(seen, crew, store))  # type: ignore[arg-type]
        assert publisher.returncode == 0, said[-3000:]
        assert (outcome.lost, outcome.duplicated, outcome.dead_letters) == (0, 0, 0), outcome
        _wait_members(cluster, _app_queues(cluster))
        _poison_pill(env, crew, store)
    finally:
        if publisher.poll() is None:
            publisher.kill()
        if publisher.stdout is not None and not publisher.stdout.closed:
            publisher.communicate(timeout=60)  # reaped and its pipe closed, whatever happened
        crew.stop()
        store.close()
