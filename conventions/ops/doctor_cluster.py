"""The doctor's Redis Cluster checks: a ``redis+cluster://`` store whose failover could
lose what it acknowledged, or whose cluster keeps answering with slots missing.

The configuration finding (no ``min_replicas``) is read from the URL alone; the server
findings ask each master (``CLUSTER NODES``, ``CONFIG GET``) when the doctor asks the
servers (at worker start). What each one means is in the "Redis Cluster" section of
``docs/howto/redis-cluster.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conventions.config import cluster, sentinel
from conventions.ops.findings import ERROR, WARNING, Finding
from conventions.tracing.scrubbing import scrub_text

#: what a failover loses when nothing waits for a replica
UNREPLICATED = (
    "Redis replicates asynchronously: a failover loses the writes the master "
    "acknowledged and no replica had yet"
)


def config_findings(conf: Any) -> Iterator[Finding]:
    """A cluster store URL that cannot be read, or whose writes wait for no replica."""
    url = conf.get("conventions_store_url")
    if not cluster.is_cluster(url):
        return
    try:
        _, _, options = cluster.parse(str(url))
        wanted, _ = sentinel.replicas_wanted(options)
    except ValueError as exc:
        yield Finding(ERROR, "cluster-store-url", "conventions_store_url", str(exc))
        return
    if wanted < 1:
        yield Finding(
            WARNING, "cluster-store-not-replicated", "conventions_store_url",
            f"min_replicas is 0: {UNREPLICATED}; a lost ledger completion lets a job "
            "delivered again run its effect twice; add ?min_replicas=1 to the store URL",
        )  # fmt: skip


def server_findings(conf: Any) -> Iterator[Finding]:
    """A master without a replica (its loss loses its slots' jobs), a node that answers
    with slots uncovered (``cluster-require-full-coverage no``), and the masters'
    eviction and persistence (as for a store on one Redis)."""
    url = conf.get("conventions_store_url")
    if not cluster.is_cluster(url):
        return
    import redis

    where = "conventions_store_url"
    try:
        client = cluster.client_from_url(str(url), socket_timeout=5)
        try:
            nodes = _nodes(client)
            settings = _settings(client)
        finally:
            client.close()
    except (redis.RedisError, ValueError) as exc:
        yield Finding(
            WARNING, "cluster-unreadable", where,
            f"could not read the cluster's nodes ({scrub_text(str(exc))}); make sure every "
            "master has a replica and cluster-require-full-coverage is yes",
        )  # fmt: skip
        return
    lonely = sorted(address for address, replicas in nodes.items() if replicas == 0)
    if lonely:
        yield Finding(
            ERROR, "cluster-master-without-replica", where,
            f"master(s) {', '.join(lonely)} have no replica: killing one loses its slots' "
            "reservations and ledger entries, and the cluster stops answering; give every "
            "master a replica (redis-cli --cluster add-node --cluster-slave)",
        )  # fmt: skip
    yield from _setting_findings(settings, where)


def _setting_findings(settings: dict[str, dict[str, str]], where: str) -> Iterator[Finding]:
    """The masters' settings that lose jobs: partial coverage, eviction, no persistence
    (the codes a single Redis store gets for the last two)."""
    partial = [node for node, found in settings.items() if found.get("coverage") == "no"]
    if partial:
        yield Finding(
            WARNING, "cluster-partial-coverage", where,
            f"cluster-require-full-coverage is no on {', '.join(sorted(partial))}: with a "
            "master lost and not failed over, the rest keep answering, so a job of a lost "
            "slot reads an empty ledger and runs again; set cluster-require-full-coverage yes",
        )  # fmt: skip
    for node, found in sorted(settings.items()):
        policy = found.get("policy", "noeviction")
        if policy != "noeviction":
            yield Finding(
                ERROR, "redis-eviction", f"redis cluster {node}",
                f"maxmemory-policy is {policy!r}: a full master silently drops idempotency "
                "keys and ledger entries; set maxmemory-policy noeviction on every node",
            )  # fmt: skip
        if found.get("persistent") == "no":
            yield Finding(
                ERROR, "redis-no-persistence", f"redis cluster {node}",
                "neither AOF nor RDB snapshots are on: a master and its replica restarted "
                "together lose every idempotency key of their slots; run the nodes with "
                "--appendonly yes",
            )  # fmt: skip


def _nodes(client: Any) -> dict[str, int]:
    """Each master holding slots (``host:port``) and how many live replicas it has
    (``CLUSTER NODES`` as redis-py answers it: a dict by address)."""
    found: dict[str, Any] = client.execute_command(
        "CLUSTER NODES", target_nodes=client.get_random_node()
    )
    live = {
        address: info for address, info in found.items()
        if "fail" not in str(info.get("flags", "")).split(",")
    }  # fmt: skip
    masters = {
        info["node_id"]: address for address, info in live.items()
        if "master" in str(info.get("flags")) and info.get("slots")
    }  # fmt: skip
    replicas: dict[str, int] = {}
    for info in live.values():
        if "slave" in str(info.get("flags")):
            replicas[info.get("master_id")] = replicas.get(info.get("master_id"), 0) + 1
    return {address: replicas.get(node_id, 0) for node_id, address in masters.items()}


def _settings(client: Any) -> dict[str, dict[str, str]]:
    """Each master's ``cluster-require-full-coverage``, ``maxmemory-policy`` and whether
    it persists (AOF or RDB snapshots); a node that refuses ``CONFIG`` (a managed
    cluster) is left out."""
    found: dict[str, dict[str, str]] = {}
    for node in client.get_primaries():
        with contextlib.suppress(Exception):
            conf = node.redis_connection.config_get("*")
            persistent = conf.get("appendonly") == "yes" or bool(conf.get("save"))
            found[f"{node.host}:{node.port}"] = {
                "coverage": str(conf.get("cluster-require-full-coverage", "yes")).lower(),
                "policy": str(conf.get("maxmemory-policy", "noeviction")),
                "persistent": "yes" if persistent else "no",
            }
    return found
