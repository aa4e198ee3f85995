"""The doctor on a 3-node RabbitMQ cluster of the test's own, through the management API
(``conventions_rabbitmq_management_url``): a healthy cluster says nothing; a node killed
is said down with every member it held offline, and once back, its leaders lost (said
unbalanced until ``rabbitmq-queues rebalance quorum``); a queue shrunk to two members
is said.

Marked ``chaos`` (``make chaos``): three nodes with the management plugin take about
20 s to start on this machine.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conventions import App
from conventions.config.profile import reliable
from conventions.ops import doctor_rabbitmq_cluster
from conventions.ops.doctor import static_checks
from conventions.transport import amqp_queues
from tests.acceptance import rabbit_cluster, rabbit_node
from tests.acceptance.rabbit_cluster import RabbitCluster
from tests.fixtures import unavailable

pytestmark = pytest.mark.chaos

QUEUE, POISON = "cc_cluster_doctor_jobs", "cc_cluster_doctor_poison"
CODES = {
    "rabbitmq-node-down", "quorum-members-below-3", "quorum-members-offline",
    "quorum-no-leader", "rabbitmq-leaders-unbalanced", "rabbitmq-cluster-unreadable",
    "rabbitmq-cluster-unchecked",
}  # fmt: skip
#: seconds the cluster may take to show a change (a node's loss, a member's return)
WITHIN = 90.0
_NUMBERS = itertools.count(1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    if not rabbit_node.installed():
        unavailable("rabbitmq-server (a cluster of the test's own)", FileNotFoundError("rabbitmq"))
    folder: Path = tmp_path_factory.mktemp("rabbit-cluster-doctor")
    with rabbit_cluster.private_cluster(folder, management=True) as started:
        yield started


@pytest.fixture
def app(cluster: RabbitCluster) -> App:
    """An app on the cluster whose queues are declared, reading the third node's API
    (the test kills the second)."""
    app = App(f"cc_cluster_doctor_{next(_NUMBERS)}", set_as_current=False)
    app.conf.update(
        reliable(broker_url=cluster.url, store_url=os.environ["CONVENTIONS_STORE_URL"]),
        task_default_queue=QUEUE,
        conventions_workloads={"doctor": QUEUE},
        conventions_poison_queue=POISON,
        conventions_rabbitmq_management_url=cluster.nodes[2].management_url,
    )
    amqp_queues.ensure(app)
    return app


def _cluster_findings(app: App) -> set[tuple[str, str]]:
    return {(f.code, f.subject) for f in static_checks(app) if f.code in CODES}


def _until(app: App, wanted: object, within: float = WITHIN) -> set[tuple[str, str]]:
    """The doctor's cluster findings once ``wanted(findings)`` holds (bounded)."""
    deadline, found = time.monotonic() + within, _cluster_findings(app)
    while not wanted(found) and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(1.0)
        found = _cluster_findings(app)
    return found


def test_a_healthy_cluster_gets_no_cluster_finding(app: App) -> None:
    assert _until(app, lambda found: not found) == set()
    members = doctor_rabbitmq_cluster.read(str(app.conf.conventions_rabbitmq_management_url), "/")[
        1
    ]
    ours = [q for q in members if q["name"] == QUEUE]
    assert len(ours[0]["members"]) == 3, ours


def test_a_node_killed_is_said_down_with_its_members_offline(
    app: App, cluster: RabbitCluster
) -> None:
    victim = cluster.nodes[1]
    victim.kill_nine()
    try:
        found = _until(app, lambda f: ("rabbitmq-node-down", victim.name) in f)
        assert ("rabbitmq-node-down", victim.name) in found, found
        assert ("quorum-members-offline", QUEUE) in found, found
        assert ("quorum-members-offline", POISON) in found, found
    finally:
        victim.start()
    # back, with its members online but none of its leaders: RabbitMQ does not move them
    unbalanced = {("rabbitmq-leaders-unbalanced", "quorum queue leaders")}
    assert _until(app, lambda f: f == unbalanced) == unbalanced
    cluster.nodes[0].queues_ctl("rebalance", "quorum")
    assert _until(app, lambda f: not f) == set()


def test_a_queue_shrunk_to_two_members_is_said(app: App, cluster: RabbitCluster) -> None:
    first, second = cluster.nodes[0], cluster.nodes[1]
    first.queues_ctl("delete_member", QUEUE, second.name)
    try:
        found = _until(app, lambda f: ("quorum-members-below-3", QUEUE) in f)
        assert ("quorum-members-below-3", QUEUE) in found, found
    finally:
        first.queues_ctl("add_member", QUEUE, second.name)
    assert _until(app, lambda f: not f) == set()
