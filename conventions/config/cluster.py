"""Redis Cluster store URLs (``redis+cluster://host:port,host:port/?...``) and a cluster
client whose writes can wait for replicas, shard by shard.

A store on Redis Cluster names some of its nodes (any of them: the client learns the
rest, and follows failovers and slot moves)::

    redis+cluster://10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000/?min_replicas=1
    rediss+cluster://:secret@10.0.0.1:7000/      (TLS; a password for every node)

A cluster has one database: a database number (``/3``) is refused. ``min_replicas``
and ``replica_wait_ms`` mean what they mean on a Sentinel store
(:mod:`conventions.config.sentinel`): each guarded write (a script, a push) is sent
with ``WAIT n ms`` in one pipeline on the connection of the master that holds its key,
so a write the store acknowledged is held by ``n`` replicas of that shard, and a
failover of that shard cannot lose it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import AskError
from redis.retry import Retry

from conventions.config.sentinel import (
    GUARDED,
    REPLICA_WAIT_MS,
    check_replicated,
    replicas_wanted,
)

#: the URL schemes of a store on Redis Cluster
SCHEMES = ("redis+cluster", "rediss+cluster")
#: the port of a node named without one
CLUSTER_PORT = 6379
#: how many times a call that cannot reach its master is tried in all
TRIES = 3
#: how many times a guarded write follows a moved slot before it gives up
MOVES = 3
#: the query options of a cluster URL that are the layer's, not redis-py's
OPTIONS = ("min_replicas", "replica_wait_ms")


def is_cluster(url: Any) -> bool:
    """Is ``url`` a Redis Cluster store URL?"""
    return isinstance(url, str) and url.partition("://")[0].lower() in SCHEMES


def is_cluster_client(client: Any) -> bool:
    """Is ``client`` a Redis Cluster client?"""
    return isinstance(client, RedisCluster)


def parse(url: str) -> tuple[list[tuple[str, int]], dict[str, Any], dict[str, str]]:
    """The nodes a cluster URL names, the client's options (credentials, TLS) and the
    layer's query options. A database number is a ValueError (a cluster has one)."""
    scheme, _, rest = url.partition("://")
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    if "?" in netloc:
        netloc, _, query = netloc.partition("?")
    if path.strip("/") not in ("", "0"):
        raise ValueError(
            "a redis+cluster:// store URL takes no database number (a cluster has one)"
        )
    credentials, _, hosts = netloc.rpartition("@")
    nodes = []
    for part in hosts.split(","):
        if not part.strip():
            continue
        parsed = urlsplit(f"//{part.strip()}")
        nodes.append((parsed.hostname or "127.0.0.1", parsed.port or CLUSTER_PORT))
    if not nodes:
        raise ValueError("a redis+cluster:// store URL names at least one node (host:port)")
    options: dict[str, Any] = {"ssl": scheme.lower().startswith("rediss")}
    if credentials:
        user, _, password = credentials.partition(":")
        options.update(username=unquote(user) or None, password=unquote(password) or None)
    pairs = dict(parse_qsl(query, keep_blank_values=True))
    ours = {k: v for k, v in pairs.items() if k in OPTIONS}
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in pairs:
            options[name] = float(pairs[name])
    return nodes, options, ours


class ReplicatedCluster(RedisCluster):
    """A cluster client whose guarded writes (:data:`~conventions.config.sentinel.GUARDED`)
    go out with ``WAIT n ms`` on the connection of their key's master, in one pipeline;
    fewer confirmations than ``min_replicas`` in time raise ``BackendUnavailable``.
    ``min_replicas`` 0: a plain cluster client."""

    min_replicas = 0
    replica_wait_ms = REPLICA_WAIT_MS
    backend = "store"

    def guard(self, min_replicas: int, wait_ms: int, backend: str) -> ReplicatedCluster:
        self.min_replicas, self.replica_wait_ms, self.backend = min_replicas, wait_ms, backend
        return self

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        command = str(args[0]).upper()
        # a script without keys names no shard (none of the store's is one)
        keyless = command in ("EVALSHA", "EVAL") and int(args[2]) == 0
        if not self.min_replicas or command not in GUARDED or keyless:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        # EVALSHA sha numkeys key...; LPUSH key ...: the first key names the shard
        first = args[3] if command in ("EVALSHA", "EVAL") else args[1]
        for _ in range(MOVES):
            node = self.get_node_from_key(first)  # type: ignore[no-untyped-call]
            try:
                pipe: Any = node.redis_connection.pipeline(transaction=False)
                pipe.execute_command(*args, **kwargs)
                pipe.execute_command("WAIT", self.min_replicas, self.replica_wait_ms)
                answer, acked = pipe.execute()
            except AskError:  # MOVED too: the slot moved, the write was not made
                self.nodes_manager.initialize()
                continue
            except (redis.ConnectionError, redis.TimeoutError):
                self.nodes_manager.initialize()  # the master is gone: learn the new one
                raise
            check_replicated(int(acked), self.min_replicas, self.replica_wait_ms, self.backend)
            return answer
        raise redis.ConnectionError(f"the slot of {first!r} kept moving ({MOVES} tries)")


def client_from_url(url: str, *, socket_timeout: float, backend: str = "store") -> RedisCluster:
    """A decoding cluster client for a ``redis+cluster://`` URL. A call that cannot reach
    its master is tried :data:`TRIES` times in all (each learning the cluster's layout
    anew: a failover's promoted replica), each try waiting a third of the timeout, so a
    silent master costs a call about ``socket_timeout`` in all, as on one Redis (redis-py's
    default, ten tries of the whole timeout each, would hold a ``.delay()`` ten times
    longer than its publish timeout)."""
    nodes, options, ours = parse(url)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    timeouts = {name: value / TRIES for name, value in {**timeouts, **options}.items()
                if name in timeouts}  # fmt: skip
    client = ReplicatedCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],  # type: ignore[no-untyped-call]
        decode_responses=True,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.25), TRIES - 1),
        **{**options, **timeouts},
    )
    return client.guard(*replicas_wanted(ours), backend)


def first_node(client: RedisCluster) -> tuple[str, int]:
    """A node of the cluster (the client's default one): ``(host, port)``."""
    node = client.get_default_node()  # type: ignore[no-untyped-call]
    return str(node.host), int(node.port)
