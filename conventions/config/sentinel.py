"""Redis Sentinel URLs (``sentinel://host:port;sentinel://...``) and acknowledged writes
that a failover keeps: how a URL is recognised and read, which two clients talk to the
same primary, and a client whose writes wait for replicas.

A Sentinel group has one primary and its replicas; Redis replicates asynchronously, so
a write the primary acknowledged may be lost when a replica is promoted before it got
it. ``WAIT n ms`` after a write blocks until ``n`` replicas hold every earlier write of
the connection (or the time is up): :class:`Replicated` sends it in the same pipeline as
each write it guards, one round trip, and raises
:class:`~conventions.errors.BackendUnavailable` when fewer replicas confirmed in time.
The layer's transport (``min_replicas``/``replica_wait_ms`` transport options) and the
Redis store (``?min_replicas=1&replica_wait_ms=500`` in its URL) use it; see the "Redis
Sentinel" section of ``docs/discussions/delivery-guarantees.md``.

A store URL names its sentinels like a broker URL, the group and the options in the
query (on any of the parts)::

    sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379/15?master_name=main&min_replicas=1

This module imports only :mod:`conventions.errors` of the layer's: the profile, the
store, the transport and the doctor all ask it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from conventions.errors import BackendUnavailable

#: redis-py's ``Sentinel``, called untyped: its signature is typed from redis-py 8.2 on
#: (untyped before), and the socket options reach it as one dict
_SENTINEL: Any = Sentinel

#: the URL schemes of a Sentinel broker or store
SCHEMES = ("sentinel://", "sentinels://")
#: the port of a sentinel named without one
SENTINEL_PORT = 26379
#: milliseconds a guarded write waits for its replicas by default
REPLICA_WAIT_MS = 500
#: the commands :class:`Replicated` guards (a script, a push, a delayed member)
GUARDED = frozenset({"EVALSHA", "EVAL", "LPUSH", "RPUSH", "ZADD"})
#: the query options of a store URL that are the layer's, not redis-py's
STORE_OPTIONS = ("master_name", "min_replicas", "replica_wait_ms")

#: what a Sentinel broker gives up on kombu's stock transport
STOCK = (
    "kombu's stock Redis transport runs on Sentinel without the layer's inbox fetch (a "
    "worker killed mid-fetch may lose that message) and without its delayed set (workers "
    "hold retry ETAs unacked, so countdowns must stay below the visibility timeout)"
)


def is_sentinel(url: Any) -> bool:
    """Is ``url`` (or one of a ``;``-separated list) a Redis Sentinel one?"""
    return isinstance(url, str) and any(part.strip().startswith(SCHEMES) for part in url.split(";"))


@dataclass(frozen=True)
class SentinelURL:
    """A parsed Sentinel URL: the sentinels, the database, the credentials of the
    primary and the query options (``master_name``, ``min_replicas``, ...)."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    tls: bool = False

    @property
    def master_name(self) -> str | None:
        return self.options.get("master_name")


def parse(url: str) -> SentinelURL:
    """Read a ``sentinel://a:26379;sentinel://b:26379/0?master_name=x`` URL; the
    database, credentials and query may be on any part (the last one given wins)."""
    sentinels: list[tuple[str, int]] = []
    db, username, password, options, tls = 0, None, None, {}, False
    for part in (p.strip() for p in url.split(";") if p.strip()):
        split = urlsplit(part)
        if split.scheme not in ("sentinel", "sentinels"):
            raise ValueError(f"not a Sentinel URL part (scheme {split.scheme}://)")
        tls = tls or split.scheme == "sentinels"
        sentinels.append((split.hostname or "127.0.0.1", split.port or SENTINEL_PORT))
        if split.path.strip("/"):
            db = int(split.path.strip("/"))
        username = unquote(split.username) if split.username else username
        password = unquote(split.password) if split.password else password
        options.update(dict(parse_qsl(split.query)))
    return SentinelURL(tuple(sentinels), db, username, password, options, tls)


def replicas_wanted(options: dict[str, Any]) -> tuple[int, int]:
    """``(min_replicas, replica_wait_ms)`` of a mapping of options (0: no wait)."""
    wanted = int(options.get("min_replicas") or 0)
    wait = int(options.get("replica_wait_ms") or REPLICA_WAIT_MS)
    if wanted < 0 or wait <= 0:
        raise ValueError("min_replicas must be 0 or more and replica_wait_ms above 0")
    return wanted, wait


class Replicated(redis.Redis):
    """A client whose guarded writes (:data:`GUARDED`) go out with ``WAIT n ms`` in one
    pipeline: the write is answered only once ``min_replicas`` replicas hold it, else
    :class:`~conventions.errors.BackendUnavailable` (``backend``: ``broker`` or
    ``store``). ``min_replicas`` 0: a plain client. Reads go out as they are."""

    min_replicas = 0
    replica_wait_ms = REPLICA_WAIT_MS
    backend = "store"

    def guard(self, min_replicas: int, wait_ms: int, backend: str) -> Replicated:
        self.min_replicas, self.replica_wait_ms, self.backend = min_replicas, wait_ms, backend
        return self

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if not self.min_replicas or str(args[0]).upper() not in GUARDED:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        pipe: Any = self.pipeline(transaction=False)
        pipe.execute_command(*args, **options)
        pipe.execute_command("WAIT", self.min_replicas, self.replica_wait_ms)
        answer, acked = pipe.execute()  # an error reply (NOSCRIPT, say) raises here
        check_replicated(int(acked), self.min_replicas, self.replica_wait_ms, self.backend)
        return answer


def check_replicated(acked: int, wanted: int, wait_ms: int, backend: str) -> None:
    """Raise when fewer than ``wanted`` replicas confirmed a write within ``wait_ms``."""
    if acked >= wanted:
        return
    raise BackendUnavailable(
        f"the {backend}'s Redis primary took the write but {acked} of {wanted} replica(s) "
        f"confirmed it within {wait_ms} ms (min_replicas): a failover now could lose it; "
        "retry with the same idempotency key, or lower min_replicas knowingly",
        backend=backend,
    )


def client_from_url(url: str, *, socket_timeout: float, backend: str = "store") -> redis.Redis:
    """A decoding client for a store URL: ``redis://``/``rediss://``/``unix://`` (with
    the layer's ``min_replicas``/``replica_wait_ms`` in the query, taken out) or
    ``sentinel://`` (the primary of ``master_name``, followed across failovers)."""
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    if not is_sentinel(url):
        plain, options = _split_options(url)
        client = cast(Replicated, Replicated.from_url(plain, decode_responses=True, **timeouts))
        return client.guard(*replicas_wanted(options), backend)
    parsed = parse(url)
    if not parsed.master_name:
        raise ValueError("a sentinel:// store URL needs ?master_name=<the monitored group>")
    manager: Any = _SENTINEL(list(parsed.sentinels), sentinel_kwargs=dict(timeouts), **timeouts)
    master: Replicated = manager.master_for(
        parsed.master_name, redis_class=Replicated, db=parsed.db, username=parsed.username,
        password=parsed.password, decode_responses=True, ssl=parsed.tls,
    )  # fmt: skip
    return master.guard(*replicas_wanted(parsed.options), backend)


def broker_client(url: str, options: Any = None, **kwargs: Any) -> redis.Redis:
    """A client of a broker's Redis: ``redis.Redis.from_url(url, **kwargs)``, or for a
    ``sentinel://`` URL the current primary of ``options['master_name']`` (the broker's
    transport options), for the readers that look at the broker's keys (the queues
    view, the doctor, backpressure)."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **kwargs)
    parsed = parse(url)
    name = (options or {}).get("master_name") or parsed.master_name
    if not name:
        raise ValueError("a sentinel:// broker needs broker_transport_options['master_name']")
    timeouts = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    manager: Any = _SENTINEL(
        list(parsed.sentinels), sentinel_kwargs=(options or {}).get("sentinel_kwargs") or timeouts
    )
    client: GroupClient = manager.master_for(
        name, redis_class=GroupClient, db=parsed.db, username=parsed.username,
        password=parsed.password, ssl=parsed.tls, **kwargs,
    )  # fmt: skip
    client.sentinels = manager
    return client


class GroupClient(redis.Redis):
    """A client of a group's current primary that closes its sentinels' connections
    when it is closed (a reader's client is closed after each use)."""

    sentinels: Any = None

    def close(self) -> None:
        super().close()
        manager, self.sentinels = self.sentinels, None
        closing = getattr(manager, "close", None)  # redis-py 8.1 and newer
        if callable(closing):
            closing()


def _split_options(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without the layer's query options, and those options."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    pairs = parse_qsl(query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in STORE_OPTIONS}
    rest = "&".join(f"{k}={v}" for k, v in pairs if k not in STORE_OPTIONS)
    return (f"{base}?{rest}" if rest else base), ours


def group_of(client: Any) -> tuple[str, frozenset[tuple[str, int]]] | None:
    """The Sentinel group a client's pool follows (its name and sentinels), or None
    for a client of one fixed server."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool):
        return None
    return str(pool.service_name), frozenset(_addresses(pool.sentinel_manager.sentinels))


def _addresses(sentinels: Iterable[Any]) -> Iterable[tuple[str, int]]:
    for node in sentinels:
        kwargs = node.connection_pool.connection_kwargs
        yield _loopback(kwargs.get("host")), int(kwargs.get("port") or SENTINEL_PORT)


def _loopback(name: Any) -> str:
    return "127.0.0.1" if name in (None, "", "localhost") else str(name)


def same_group(url: Any, master_name: Any, client: Any) -> bool:
    """Whether a broker ``url`` of Sentinel group ``master_name`` and ``client`` follow
    the same primary (same group name, a sentinel in common)."""
    group = group_of(client)
    if group is None or not is_sentinel(url) or not master_name:
        return False
    named = {(_loopback(h), p) for h, p in parse(url).sentinels}
    return group[0] == master_name and bool(named & group[1])


def same_primary(one: Any, other: Any) -> bool | None:
    """Whether two clients follow the same Sentinel group (True/False), or None when
    neither follows one (compare their servers instead)."""
    first, second = group_of(one), group_of(other)
    if first is None and second is None:
        return None
    return (
        first is not None
        and second is not None
        and first[0] == second[0]
        and bool(first[1] & second[1])
    )
