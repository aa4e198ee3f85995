"""The Redis store: one round trip and one atomic step per ledger operation.

Every rule that must hold under concurrency lives in Redis itself: the enqueue
reservation is ``SET NX GET``, and ``claim`` / ``renew`` / ``complete`` / ``release`` are
Lua scripts (registered once, run by ``EVALSHA``), so no two workers can both read "free"
and both write "mine". Leases are key expiries (``PX``): a worker that dies simply lets
its ledger entry vanish and the next claim takes over. Key names are in
:mod:`conventions.store.keys`. Needs Redis 7.0 or later (``SET NX GET``, ``ZADD GT``).

The store is one class in three parts: this module holds the dedup and ledger calls
(their scripts in :mod:`conventions.store.redis_scripts`),
:mod:`conventions.store.redis_records` the dead letters and audit trails, and
:mod:`conventions.store.redis_coordination` the leases, token buckets and state records.

The same class serves Redis Cluster (``redis+cluster://``, :mod:`conventions.config.cluster`):
there every key of one job carries its partition's hash tag (:func:`keys.scope`), so each
script runs on the one shard that holds them all, and the fleet-wide readers (listings,
counts, purges) visit every partition (:func:`keys.scopes`). On one Redis node both
answer the plain prefix: the same names, the same single round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

import redis

from conventions.config import cluster, sentinel
from conventions.config.profile import PUBLISH_TIMEOUT
from conventions.config.settings import (
    AUDIT_MAX_EVENTS,
    AUDIT_MAX_TRAILS,
    DEFAULT_LEDGER_KEEP,
    RUNS_MAX,
    RUNS_MAX_LOGS,
)
from conventions.store import keys, redis_done
from conventions.store.base import KeyState
from conventions.store.batches import BatchMove
from conventions.store.records import AuditEvent, Claim, ClaimStatus, Holder, utcnow
from conventions.store.redis_batches import with_batch
from conventions.store.redis_coordination import RedisCoordination, _ms
from conventions.store.redis_records import RedisRecords
from conventions.store.redis_results import ResultWrite, with_result
from conventions.store.redis_scripts import (
    CLAIM,
    CLEAR_KEY,
    COMPLETE,
    RELEASE,
    RENEW,
    RESERVE,
    RESERVE_PUSH,
    UNRESERVE_ONE,
)

#: seconds a store call made from a URL waits to connect, and then for each reply, before
#: it raises (``redis.TimeoutError``; ``.delay()`` turns it into ``BackendUnavailable``):
#: the profile's default publish timeout. ``?socket_timeout=`` /
#: ``?socket_connect_timeout=`` in the URL override it. A refused connection raises at once.
SOCKET_TIMEOUT = PUBLISH_TIMEOUT


def database_of(client: redis.Redis) -> int:
    """The database number a redis-py client selects (0 on a cluster: it has one)."""
    pool = getattr(client, "connection_pool", None)
    return int(pool.connection_kwargs.get("db") or 0) if pool is not None else 0


class RedisStore(RedisRecords, RedisCoordination):
    """The :class:`~conventions.store.base.Store` contract on one Redis node (or a
    replicated primary), or on Redis Cluster.

    Thread-safe: the client's connection pool hands each call its own connection. A
    client passed in is used as is (it must use ``decode_responses=True``) and is left
    open by :meth:`close`; a client made from a URL is closed by it, and waits
    ``socket_timeout`` seconds at most to connect and for each reply.
    """

    def __init__(
        self,
        client_or_url: redis.Redis | str,
        prefix: str = keys.DEFAULT_PREFIX,
        delivery_ttl: float = 7 * 86400,
        audit_ttl: float = 14 * 86400,
        *,
        audit_max_trails: int = AUDIT_MAX_TRAILS,
        audit_max_events: int = AUDIT_MAX_EVENTS,
        runs_enabled: bool = True,
        runs_max: int = RUNS_MAX,
        runs_max_logs: int = RUNS_MAX_LOGS,
        socket_timeout: float = SOCKET_TIMEOUT,
        done_horizon: float = DEFAULT_LEDGER_KEEP,
    ) -> None:
        if isinstance(client_or_url, str) and cluster.is_cluster(client_or_url):
            # redis+cluster://host:port,host:port/?min_replicas=: WAIT per shard
            # (typed as a Redis client: the store calls only what both answer)
            made = cluster.client_from_url(client_or_url, socket_timeout=socket_timeout)
            self.client = cast(redis.Redis, made)
            self._owns_client = True
        elif isinstance(client_or_url, str):
            # redis://, or sentinel://...;...?master_name= (the group's primary, followed
            # across failovers); ?min_replicas=&replica_wait_ms= make every script and
            # push wait for replicas in its round trip (conventions.config.sentinel)
            self.client = sentinel.client_from_url(client_or_url, socket_timeout=socket_timeout)
            self._owns_client = True
        else:
            if not client_or_url.get_connection_kwargs().get("decode_responses"):
                raise ValueError("RedisStore needs a client made with decode_responses=True")
            self.client = client_or_url
            self._owns_client = False
        self.prefix = prefix
        #: on Redis Cluster: every job's keys carry its partition's hash tag
        self.clustered = cluster.is_cluster_client(self.client)
        self.delivery_ttl = delivery_ttl
        #: the longest ``keep`` of a done entry (``conventions_ledger_keep_seconds``): how
        #: many day buckets its readers look in (:mod:`conventions.store.redis_done`)
        self.done_horizon = done_horizon
        self.audit_ttl = audit_ttl
        self.audit_max_trails = self._share(audit_max_trails)  # per partition on a cluster
        self.audit_max_events = audit_max_events
        self.runs_enabled, self.runs_max, self.runs_max_logs = runs_enabled, runs_max, runs_max_logs
        register = self.client.register_script
        self._reserve = register(RESERVE)
        self._reserve_push = register(RESERVE_PUSH)
        self._unreserve = register(UNRESERVE_ONE)
        self._clear_key = register(CLEAR_KEY)
        self._claim = register(CLAIM)
        self._renew = register(RENEW)
        self._complete = register(COMPLETE)
        self._claim_with_result = register(with_result(CLAIM))
        self._complete_with_result = register(with_result(COMPLETE))
        self._complete_batch = register(with_batch(COMPLETE))
        self._complete_batch_with_result = register(with_result(with_batch(COMPLETE)))
        self._release = register(RELEASE)
        self._register_batches()
        self._register_records()
        self._register_coordination()

    # -- enqueue dedup ---------------------------------------------------------------
    def reserve(
        self,
        key: str,
        job_id: str,
        ttl: float | None,
        *,
        audit: AuditEvent | None = None,
        fingerprint: str | None = None,
    ) -> Holder | None:
        """One script: atomic, answers the holder, records ``audit`` when it reserved."""
        p = self._scope(key)
        audit_keys, audit_args = self._audit_parts(audit, p)
        held = self._reserve(
            keys=[keys.dedup(key, p), keys.dedup_print(key, p), *audit_keys],
            args=[job_id, "" if ttl is None else _ms(ttl), fingerprint or "", *audit_args],
        )
        return _holder(held)

    def reserve_and_push(  # noqa: PLR0917
        self,
        broker: redis.Redis,
        queue_list: str,
        message: str,
        key: str | None,
        job_id: str,
        ttl: float | None,
        audit: AuditEvent | None,
        fingerprint: str | None = None,
        bell: tuple[str, int, int] | None = None,
        events: Sequence[tuple[str, str]] = (),
    ) -> Holder | None:
        """:meth:`reserve` and kombu's ``LPUSH`` in one script on ``broker``'s connection
        (a client of the same server, any database): the holder when ``key`` is taken by
        another job (nothing is pushed), else None. ``key=None``: no reservation, the
        audit event and the push only. ``bell``: the queue's bell, its cap and ttl, rung with
        the push (the transport's, which wakes an idle consumer of several queues).
        ``events``: (channel, payload) published after the push (the job's ``task-sent``
        event, :mod:`conventions.transport.hook`)."""
        p = self._scope(key)
        audit_keys, audit_args = self._audit_parts(audit, p)
        dedup = keys.dedup(key, p) if key is not None else queue_list
        printed = keys.dedup_print(key, p) if key is not None else queue_list
        held = self._reserve_push(
            keys=[dedup, queue_list, printed, bell[0] if bell else queue_list, *audit_keys],
            args=[
                job_id, "" if ttl is None else _ms(ttl), "0" if key is None else "1",
                self.database, database_of(broker), message, fingerprint or "",
                bell[1] if bell else 0, bell[2] if bell else 0,
                len(events), *(part for event in events for part in event), *audit_args,
            ],
            client=broker,
        )  # fmt: skip
        return _holder(held)

    @property
    def database(self) -> int:
        """The store's Redis database number."""
        return database_of(self.client)

    def server(self) -> tuple[str, int]:
        """Which Redis server the store talks to: ``(host, port)`` (on a cluster, one
        of its nodes)."""
        if self.clustered:
            return cluster.first_node(cast(Any, self.client))
        kwargs = self.client.connection_pool.connection_kwargs
        return str(kwargs.get("host") or kwargs.get("path")), int(kwargs.get("port") or 0)

    def shares_server(self, host: str | None, port: int | None) -> bool:
        """Whether a client of ``host:port`` talks to the store's Redis server (any
        database; ``localhost`` is the loopback address)."""

        if self.clustered:  # keys of several shards: nothing rides another's script
            return False

        def loopback(name: str | None) -> str:
            return "127.0.0.1" if name in (None, "", "localhost") else str(name)

        name, own_port = self.server()
        return (loopback(host), int(port or 0)) == (loopback(name), own_port)

    def unreserve(self, key: str, job_id: str) -> None:
        p = self._scope(key)
        self._unreserve(keys=[keys.dedup(key, p), keys.dedup_print(key, p)], args=[job_id])

    def key_state(self, key: str) -> KeyState:
        """A read (one ``MULTI``/``EXEC``), never a script: it goes out as it is where
        writes wait for replicas."""
        pipe = self.client.pipeline(transaction=True)
        p = self._scope(key)
        dedup, ledger = keys.dedup(key, p), keys.ledger(key, p)
        buckets, (_, field) = self._done_parts(key, p)
        pipe.get(dedup)
        pipe.pttl(dedup)
        pipe.hmget(ledger, "state", "owner", "outcome")
        pipe.pttl(ledger)
        for bucket in buckets:
            pipe.hget(bucket, field)
        holder, reserved_ms, entry, entry_ms, *values = pipe.execute()
        found = [holder, reserved_ms, *entry, entry_ms]
        done = redis_done.read(buckets, values)
        if entry[0] != "done" and done is not None:
            found[2:] = done
        return _key_state(key, found)

    def clear_key(self, key: str, *, audit: AuditEvent | None = None) -> KeyState:
        p = self._scope(key)
        audit_keys, audit_args = self._audit_parts(audit, p)
        buckets, done_args = self._done_parts(key, p)
        found = self._clear_key(
            keys=[
                keys.dedup(key, p), keys.ledger(key, p), keys.dedup_print(key, p), *buckets,
                *audit_keys,
            ],
            args=[*done_args, *audit_args],
        )  # fmt: skip
        return _key_state(key, list(found))

    def _done_parts(self, key: str, p: str) -> tuple[list[str], list[Any]]:
        """The done buckets a reader of ``key`` looks in (KEYS), and (ARGV) how many
        they are and the key's field in them."""
        buckets = [keys.done(day, p) for day in redis_done.days(self.done_horizon)]
        return buckets, [len(buckets), redis_done.digest(key)]

    # -- execution ledger --------------------------------------------------------------
    def claim(
        self,
        key: str,
        owner: str,
        lease: float,
        delivery_id: str,
        *,
        audit: AuditEvent | None = None,
        result: ResultWrite | None = None,
    ) -> Claim:
        """``result``: Celery's STARTED write, sent in the same script."""
        p = self._scope(key)
        audit_keys, audit_args = self._audit_parts(audit, p)
        script, keys_, args = self._riding(self._claim, self._claim_with_result, result)
        buckets, done_args = self._done_parts(key, p)
        status, holder, outcome, count, *printed = cast(
            "list[Any]",
            script(
                keys=[
                    *keys_, keys.ledger(key, p), keys.deliveries(delivery_id, p), *buckets,
                    *audit_keys,
                ],
                args=[
                    *args, owner, _ms(lease), _ms(self.delivery_ttl), *done_args, *audit_args,
                ],
            ),
        )  # fmt: skip
        return Claim(
            ClaimStatus(status), holder=holder, deliveries=int(count), outcome=outcome,
            fingerprint=redis_done.long_print(printed[0]) if printed else None,
        )  # fmt: skip

    def renew(self, key: str, owner: str, lease: float) -> bool:
        renewed = self._renew(keys=[keys.ledger(key, self._scope(key))], args=[owner, _ms(lease)])
        return bool(renewed)

    def complete(
        self,
        key: str,
        owner: str,
        outcome: str,
        keep: float,
        reserved_by: str | None,
        *,
        audit: AuditEvent | None = None,
        result: ResultWrite | None = None,
        fingerprint: str | None = None,
        delivery_id: str | None = None,
        batch: BatchMove | None = None,
    ) -> list[str]:
        """``result``: Celery's SUCCESS write, sent in the same script. ``delivery_id``:
        the delivery whose claim counter goes (a done key counts no more claims).
        ``batch``: the member's end, moved in the same script; answers the batch
        callbacks it made due."""
        p = self._scope(key)
        audit_keys, audit_args = self._audit_parts(audit, p)
        if batch is None:
            script, keys_, args = self._riding(self._complete, self._complete_with_result, result)
        else:
            script, keys_, args = self._riding(
                self._complete_batch, self._complete_batch_with_result, result
            )
            batch_keys, batch_args = self._batch_parts(batch)
            keys_, args = [*keys_, *batch_keys], [*args, *batch_args]
        buckets, done_args = self._done_parts(key, p)
        counter = keys.ledger(key, p) if delivery_id is None else keys.deliveries(delivery_id, p)
        answer = script(
            keys=[*keys_, *self._key_pair(key), counter, *buckets, *audit_keys],
            args=[
                *args, owner, outcome, _ms(keep), *self._reservation(reserved_by),
                redis_done.short_print(fingerprint), *done_args, *audit_args,
            ],
        )  # fmt: skip
        return [] if batch is None else [str(due) for due in cast("list[Any]", answer)[1]]

    def release(self, key: str, owner: str, reserved_by: str | None) -> None:
        self._release(
            keys=self._key_pair(key), args=[owner, "", 0, *self._reservation(reserved_by)]
        )

    def _key_pair(self, key: str) -> list[str]:
        """The ledger entry, the reservation and its fingerprint of ``key``."""
        p = self._scope(key)
        return [keys.ledger(key, p), keys.dedup(key, p), keys.dedup_print(key, p)]

    def _riding(
        self, plain: Any, with_result: Any, result: ResultWrite | None
    ) -> tuple[Any, list[str], list[Any]]:
        """The script to run and the leading KEYS and ARGV of ``result``, if any."""
        if result is None:
            return plain, [], []
        keys_, args = result.parts(self.database)
        return with_result, keys_, args

    @staticmethod
    def _reservation(reserved_by: str | None) -> list[str]:
        return ["0", ""] if reserved_by is None else ["1", reserved_by]

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


def _holder(held: Any) -> Holder | None:
    """The holder a reservation script answered ({job id, fingerprint}), or None."""
    if not held:
        return None
    job_id, printed = (
        item.decode() if isinstance(item, bytes) else str(item or "") for item in held
    )
    return Holder(job_id, printed)


def _key_state(key: str, found: list[Any]) -> KeyState:
    """A :class:`KeyState` from (holder, its pttl, state, owner, outcome, the entry's pttl)."""
    holder, reserved_ms, state, owner, outcome, entry_ms = found
    now = utcnow()

    def until(ms: Any) -> Any:
        return now + timedelta(milliseconds=int(ms)) if ms is not None and int(ms) >= 0 else None

    return KeyState(
        key=key, reserved_by=holder or None, reserved_until=until(reserved_ms) if holder else None,
        ledger_state=state or None, ledger_owner=owner or None, ledger_outcome=outcome or None,
        ledger_until=until(entry_ms) if state else None,
    )  # fmt: skip
