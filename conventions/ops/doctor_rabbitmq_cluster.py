"""The doctor on a RabbitMQ cluster: a node down, a quorum queue with fewer than three
members (or members offline, or no leader), and leaders gathered on few nodes.

AMQP alone cannot tell any of it: a passive ``queue.declare`` answers a queue's ready
messages and consumers, nothing of its members or leader, and a connection sees one node.
The management API can (``GET /api/nodes``: each node and whether it runs;
``GET /api/queues/<vhost>``: each quorum queue's ``leader``, ``members`` and ``online``),
so the checks run when the app names it, ``conventions_rabbitmq_management_url``
(``http://user:password@host:15672``; the management plugin enabled on the nodes).
Without it, a broker URL naming several nodes (a failover list ``amqp://a;amqp://b``)
gets one warning that the cluster was not checked.

A quorum queue of ``n`` members stays available while a majority of them is up: with 3,
one node may die; with 2, none. Leaders gathered on one node put every queue's work (and
the queues' elections when it dies) on it: ``rabbitmq-queues rebalance quorum`` spreads
them, ``queue_leader_locator = balanced`` (RabbitMQ 3.10+) places new ones.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from conventions.config import settings
from conventions.ops.findings import ERROR, WARNING, Finding
from conventions.tracing.scrubbing import scrub_text

#: the members a quorum queue needs to survive the loss of one node
MEMBERS = 3
#: leaders on the busiest node beyond the quietest's before the doctor says unbalanced
LEADER_SLACK = 1
SETTING = "conventions_rabbitmq_management_url"
#: Celery's native delayed delivery queues (the app's countdowns wait there)
DELAY_QUEUES = "celery_delayed_"
#: seconds each management request may take
TIMEOUT = 5.0


def nodes_named(conf: Any) -> int:
    """How many broker URLs the app's ``broker_url`` lists (``;``-separated)."""
    return len([u for u in str(conf.get("broker_url") or "").split(";") if u.strip()])


def config_findings(conf: Any) -> Iterator[Finding]:
    """A failover list of RabbitMQ nodes and no management URL to check the cluster by."""
    if settings.is_amqp(conf) and nodes_named(conf) > 1 and not conf.get(SETTING):
        yield Finding(
            WARNING, "rabbitmq-cluster-unchecked", "broker_url",
            "the broker URL lists several RabbitMQ nodes, and AMQP cannot tell which are "
            "down, how many members each quorum queue has, or where the leaders are; set "
            f"{SETTING} = 'http://user:password@host:15672' (the management plugin) for "
            "the doctor to check them",
        )  # fmt: skip


def cluster_findings(
    nodes: Sequence[Mapping[str, Any]], queues: Sequence[Mapping[str, Any]], names: set[str]
) -> Iterator[Finding]:
    """What ``/api/nodes`` and ``/api/queues`` say: nodes not running, and of the app's
    quorum queues (``names``) those with fewer than three members, members offline, no
    leader; leaders unbalanced over the running nodes."""
    running = sorted(str(n["name"]) for n in nodes if n.get("running"))
    for node in sorted(str(n["name"]) for n in nodes if not n.get("running")):
        yield Finding(
            ERROR, "rabbitmq-node-down", node,
            f"the cluster counts this node as down ({len(running)} of {len(nodes)} running): "
            "its queues' members on it are offline, and one more loss stops every quorum "
            "queue of three members that had one there; start it again (rabbitmq-server), "
            "or remove it for good (rabbitmqctl forget_cluster_node)",
        )  # fmt: skip
    leaders: Counter[str] = Counter()
    for queue in sorted(queues, key=lambda q: str(q.get("name"))):
        name = str(queue.get("name"))
        if not (name in names or name.startswith(DELAY_QUEUES)) or queue.get("type") != "quorum":
            continue
        yield from _queue_findings(name, queue)
        if queue.get("leader"):
            leaders[str(queue["leader"])] += 1
    if len(running) > 1 and sum(leaders.values()) >= len(running):
        counts = {node: leaders.get(node, 0) for node in running}
        if max(counts.values()) - min(counts.values()) > LEADER_SLACK:
            spread = ", ".join(f"{node} {count}" for node, count in sorted(counts.items()))
            yield Finding(
                WARNING, "rabbitmq-leaders-unbalanced", "quorum queue leaders",
                f"the app's queue leaders are gathered ({spread}): the busiest node does "
                "their work and their elections when it dies; run rabbitmq-queues "
                "rebalance quorum, and set queue_leader_locator = balanced for new queues",
            )  # fmt: skip


def _queue_findings(name: str, queue: Mapping[str, Any]) -> Iterator[Finding]:
    members = list(queue.get("members") or ())
    online = list(queue.get("online") or ())
    if len(members) < MEMBERS:
        yield Finding(
            WARNING, "quorum-members-below-3", name,
            f"{len(members)} member(s) ({', '.join(members) or 'none'}): the loss of one "
            "node can stop the queue (a majority must be up) or lose it; grow it "
            f"(rabbitmq-queues grow <node> all) or declare it on a cluster of {MEMBERS} nodes",
        )  # fmt: skip
    offline = sorted(set(members) - set(online))
    if offline:
        yield Finding(
            ERROR if len(online) * 2 <= len(members) else WARNING,
            "quorum-members-offline", name,
            f"member(s) {', '.join(offline)} offline, {len(online)} of {len(members)} "
            "online: the queue works while a majority is up; bring the node(s) back",
        )  # fmt: skip
    if not queue.get("leader"):
        yield Finding(
            ERROR, "quorum-no-leader", name,
            "no leader: publishes to it are refused and nothing is delivered until a "
            "majority of its members is up",
        )  # fmt: skip


def read(url: str, vhost: str, timeout: float = TIMEOUT) -> tuple[list[Any], list[Any]]:
    """``/api/nodes`` and ``/api/queues/<vhost>`` of the management API at ``url``."""
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}{parts.path.rstrip('/')}"
    token = base64.b64encode(f"{parts.username or ''}:{parts.password or ''}".encode()).decode()

    def get(path: str) -> list[Any]:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            found = json.loads(answer.read())
        return found if isinstance(found, list) else []

    nodes = get("/api/nodes?columns=name,running")
    queues = get(f"/api/queues/{quote(vhost, safe='')}?columns=name,type,leader,members,online")
    return nodes, queues


def vhost(conf: Any) -> str:
    """The vhost of the app's first broker URL (``/`` when it names none)."""
    path = urlsplit(str(conf.get("broker_url") or "").split(";")[0]).path
    return path[1:] if len(path) > 1 else "/"


def server_findings(conf: Any, names: set[str]) -> Iterator[Finding]:
    """:func:`cluster_findings` of the management API the app names; nothing without one."""
    url = conf.get(SETTING)
    if not url or not settings.is_amqp(conf):
        return
    try:
        nodes, queues = read(str(url), vhost(conf))
    except (OSError, ValueError) as exc:
        yield Finding(
            WARNING, "rabbitmq-cluster-unreadable", SETTING,
            f"the management API did not answer ({scrub_text(str(exc))}): the cluster's "
            "nodes and queue members were not checked",
        )  # fmt: skip
        return
    yield from cluster_findings(nodes, queues, names | {settings.poison_queue(conf)})
