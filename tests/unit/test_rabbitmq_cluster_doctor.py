"""The doctor on a RabbitMQ cluster, from what the management API answers (no broker):
a node down, quorum queues short of members or offline, leaders gathered."""

from __future__ import annotations

from typing import Any

from conventions.ops import doctor_rabbitmq_cluster as rc
from conventions.ops.findings import ERROR, WARNING

A, B, C = "rabbit@a", "rabbit@b", "rabbit@c"
NODES = [{"name": A, "running": True}, {"name": B, "running": True}, {"name": C, "running": True}]


def _queue(name: str, leader: str, members: tuple[str, ...] = (A, B, C),
           online: tuple[str, ...] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"name": name, "type": "quorum", "leader": leader, "members": list(members),
            "online": list(members if online is None else online)}  # fmt: skip


def _codes(nodes: list[dict[str, Any]], queues: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    found = rc.cluster_findings(nodes, queues, {"q1", "q2", "q3"})
    return {(f.level, f.code, f.subject) for f in found}


def test_a_healthy_cluster_with_spread_leaders_has_no_finding() -> None:
    queues = [_queue("q1", A), _queue("q2", B), _queue("q3", C)]
    assert _codes(NODES, queues) == set()


def test_a_node_down_is_an_error_and_its_members_offline_are_said() -> None:
    nodes = [*NODES[:2], {"name": C, "running": False}]
    queues = [_queue("q1", A, online=(A, B)), _queue("q2", B, online=(A, B))]
    assert _codes(nodes, queues) == {
        (ERROR, "rabbitmq-node-down", C),
        (WARNING, "quorum-members-offline", "q1"),
        (WARNING, "quorum-members-offline", "q2"),
    }


def test_a_quorum_queue_of_two_members_warns_and_one_without_majority_is_an_error() -> None:
    queues = [_queue("q1", A, members=(A, B)), _queue("q2", "", online=(A,))]
    assert _codes(NODES, queues) == {
        (WARNING, "quorum-members-below-3", "q1"),
        (ERROR, "quorum-members-offline", "q2"),
        (ERROR, "quorum-no-leader", "q2"),
    }


def test_leaders_gathered_on_one_node_are_unbalanced() -> None:
    queues = [_queue("q1", A), _queue("q2", A), _queue("q3", A)]
    assert _codes(NODES, queues) == {
        (WARNING, "rabbitmq-leaders-unbalanced", "quorum queue leaders"),
    }


def test_queues_of_other_apps_and_classic_queues_are_not_the_doctors_business() -> None:
    other = _queue("someone_else", A, members=(A,))
    classic = {"name": "q1", "type": "classic", "members": [], "online": []}
    delays = _queue("celery_delayed_3", A, members=(A, B))
    assert _codes(NODES, [other, classic, delays]) == {
        (WARNING, "quorum-members-below-3", "celery_delayed_3"),
    }


def test_a_failover_list_without_a_management_url_says_the_cluster_is_unchecked() -> None:
    conf = {"broker_url": "amqp://a:5672//;amqp://b:5672//"}
    assert [f.code for f in rc.config_findings(conf)] == ["rabbitmq-cluster-unchecked"]
    conf["conventions_rabbitmq_management_url"] = "http://guest:guest@a:15672"
    assert list(rc.config_findings(conf)) == []
    assert list(rc.config_findings({"broker_url": "amqp://a:5672//"})) == []


def test_the_vhost_is_read_from_the_first_broker_url() -> None:
    assert rc.vhost({"broker_url": "amqp://a//;amqp://b//"}) == "/"
    assert rc.vhost({"broker_url": "amqp://a/shop;amqp://b/shop"}) == "shop"
