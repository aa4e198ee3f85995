"""The Redis store: one round trip and one atomic step per ledger operation.

Every rule that must hold under concurrency lives in Redis itself: the enqueue
reservation is ``SET NX GET``, and ``claim`` / ``renew`` / ``complete`` / ``release`` are
Lua scripts (registered once, run by ``EVALSHA``), so no two workers can both read "free"
and both write "mine". Leases are key expiries (``PX``): a worker that dies simply lets
its ledger entry vanish and the next claim takes over. Key names are in
:mod:`conventions.keys`. Needs Redis 7.0 or later (``SET NX GET``, ``ZADD GT``).

The store is one class in three parts: this module holds the dedup and ledger scripts,
:mod:`conventions.store.redis_records` the dead letters and audit trails (and why the
store targets one Redis node, not Redis Cluster), and
:mod:`conventions.store.redis_coordination` the leases, token buckets and state records.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import redis

from conventions import keys
from conventions.records import AuditEvent, Claim, ClaimStatus, utcnow
from conventions.store.base import KeyState
from conventions.store.redis_coordination import DELETE_IF_HELD, RedisCoordination, _ms
from conventions.store.redis_records import (
    AUDIT,
    AUDIT_MAX_EVENTS,
    AUDIT_MAX_TRAILS,
    RedisRecords,
)
from conventions.store.redis_results import ResultWrite, with_result

#: Defines ``take_reservation()``: the dedup key KEYS[1] for job ARGV[1] (ttl ms ARGV[2],
#: or '' for none). Returns the other job holding it, or false when it is this job's
#: (taken now, with the audit event recorded, or already).
_TAKE_RESERVATION = """
local function take_reservation()
  local holder = redis.call('GET', KEYS[1])
  if holder then
    if holder == ARGV[1] then return false end
    return holder
  end
  if ARGV[2] == '' then
    redis.call('SET', KEYS[1], ARGV[1])
  else
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  end
  record_audit()
  return false
end
"""

#: KEYS: dedup, audit keys. ARGV: job id, ttl ms or '', audit args.
#: Returns the holder's job id, or false when the reservation is ours (the audit event
#: is recorded only when this call made the reservation).
_RESERVE = AUDIT + _TAKE_RESERVATION + "return take_reservation()\n"

#: The publish in one round trip (:mod:`conventions.onetrip`), run on the broker's
#: connection: in the store's database, the reservation (when ARGV[3] is '1') and the
#: audit event; then, in the broker's, kombu's ``LPUSH`` of the message (``SELECT`` only
#: when the two databases differ, so a server that refuses it works with one database).
#: KEYS: dedup, the queue's list, audit keys. ARGV: job id, ttl ms or '', reserve ('1' or
#: '0'), store db, broker db, message, audit args. Returns the holder (nothing pushed) or
#: false.
_RESERVE_PUSH = (
    AUDIT
    + _TAKE_RESERVATION
    + """
local other_db = ARGV[4] ~= ARGV[5]
if other_db then redis.call('SELECT', ARGV[4]) end
local holder = false
if ARGV[3] == '1' then holder = take_reservation() else record_audit() end
if other_db then redis.call('SELECT', ARGV[5]) end
if holder then return holder end
redis.call('LPUSH', KEYS[2], ARGV[6])
return false
"""
)

#: KEYS: ledger, deliveries, audit keys. ARGV: owner, lease ms, delivery ttl
#: ms, audit args. Returns {status, holder, outcome, deliveries}; the audit event is
#: recorded only on a claim.
_CLAIM = (
    AUDIT
    + """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner', 'outcome')
if entry[1] == 'done' then
  return {'done', entry[2], entry[3], 0}
end
if entry[1] == 'running' then
  return {'held', entry[2], false, 0}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local count = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
record_audit()
return {'claimed', ARGV[1], false, count}
"""
)

#: KEYS: ledger. ARGV: owner, lease ms. Returns 1 when the lease was ours and extended.
_RENEW = """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner')
if entry[1] == 'running' and entry[2] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

#: Drops the enqueue reservation KEYS[2] when ARGV[4] is '1' and it holds ARGV[5].
_UNRESERVE = """
if ARGV[4] == '1' and redis.call('GET', KEYS[2]) == ARGV[5] then
  redis.call('DEL', KEYS[2])
end
"""

#: KEYS: ledger, dedup, audit keys. ARGV: owner, outcome, keep ms, has
#: reservation, reserved_by, audit args. Records done when the lease is still ours or the
#: entry vanished (our lease expired but the body finished: the result stands); the audit
#: event is recorded either way, except on a replay (done already, by this owner: a
#: retried write whose first reply was lost). Returns 1 when done was recorded.
_COMPLETE = (
    AUDIT
    + """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner')
if entry[1] == 'done' and entry[2] == ARGV[1] then return 0 end  -- a replay: done already
local recorded = 0
if entry[1] == false or (entry[1] == 'running' and entry[2] == ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'done', 'owner', ARGV[1], 'outcome', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  recorded = 1
end
"""
    + _UNRESERVE
    + "record_audit()\nreturn recorded\n"
)

#: KEYS: ledger, dedup. ARGV: owner, (unused), (unused), has reservation, reserved_by.
_RELEASE = (
    """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner')
local released = 0
if entry[1] == 'running' and entry[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
"""
    + _UNRESERVE
    + "return released\n"
)


#: KEYS: dedup, ledger, audit keys. ARGV: audit args. Drops both, records the audit
#: event; returns {holder, its pttl, state, owner, outcome, the entry's pttl}.
_CLEAR_KEY = (
    AUDIT
    + """
local holder = redis.call('GET', KEYS[1])
local reserved_ms = redis.call('PTTL', KEYS[1])
local entry = redis.call('HMGET', KEYS[2], 'state', 'owner', 'outcome')
local entry_ms = redis.call('PTTL', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
record_audit()
return {holder, reserved_ms, entry[1], entry[2], entry[3], entry_ms}
"""
)


def database_of(client: redis.Redis) -> int:
    """The database number a redis-py client selects."""
    return int(client.connection_pool.connection_kwargs.get("db") or 0)


class RedisStore(RedisRecords, RedisCoordination):
    """The :class:`~conventions.store.base.Store` contract on one Redis node.

    Thread-safe: the client's connection pool hands each call its own connection. A
    client passed in is used as is (it must use ``decode_responses=True``) and is left
    open by :meth:`close`; a client made from a URL is closed by it.
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
    ) -> None:
        if isinstance(client_or_url, str):
            self.client = redis.Redis.from_url(client_or_url, decode_responses=True)
            self._owns_client = True
        else:
            if not client_or_url.get_connection_kwargs().get("decode_responses"):
                raise ValueError("RedisStore needs a client made with decode_responses=True")
            self.client = client_or_url
            self._owns_client = False
        self.prefix = prefix
        self.delivery_ttl = delivery_ttl
        self.audit_ttl = audit_ttl
        self.audit_max_trails = audit_max_trails
        self.audit_max_events = audit_max_events
        register = self.client.register_script
        self._reserve = register(_RESERVE)
        self._reserve_push = register(_RESERVE_PUSH)
        self._unreserve = register(DELETE_IF_HELD)
        self._clear_key = register(_CLEAR_KEY)
        self._claim = register(_CLAIM)
        self._renew = register(_RENEW)
        self._complete = register(_COMPLETE)
        self._claim_with_result = register(with_result(_CLAIM))
        self._complete_with_result = register(with_result(_COMPLETE))
        self._release = register(_RELEASE)
        self._register_records()
        self._register_coordination()

    # -- enqueue dedup ---------------------------------------------------------------
    def reserve(
        self, key: str, job_id: str, ttl: float | None, *, audit: AuditEvent | None = None
    ) -> str | None:
        """One script: atomic, answers the holder, records ``audit`` when it reserved."""
        audit_keys, audit_args = self._audit_parts(audit)
        holder = self._reserve(
            keys=[keys.dedup(key, self.prefix), *audit_keys],
            args=[job_id, "" if ttl is None else _ms(ttl), *audit_args],
        )
        return None if not holder else cast(str, holder)

    def reserve_and_push(  # noqa: PLR0917
        self,
        broker: redis.Redis,
        queue_list: str,
        message: str,
        key: str | None,
        job_id: str,
        ttl: float | None,
        audit: AuditEvent | None,
    ) -> str | None:
        """:meth:`reserve` and kombu's ``LPUSH`` in one script on ``broker``'s connection
        (a client of the same server, any database): the holder when ``key`` is taken by
        another job (nothing is pushed), else None. ``key=None``: no reservation, the
        audit event and the push only."""
        audit_keys, audit_args = self._audit_parts(audit)
        dedup = keys.dedup(key, self.prefix) if key is not None else queue_list
        holder = self._reserve_push(
            keys=[dedup, queue_list, *audit_keys],
            args=[
                job_id, "" if ttl is None else _ms(ttl), "0" if key is None else "1",
                self.database, database_of(broker), message, *audit_args,
            ],
            client=broker,
        )  # fmt: skip
        if not holder:
            return None
        return holder.decode() if isinstance(holder, bytes) else str(holder)

    @property
    def database(self) -> int:
        """The store's Redis database number."""
        return database_of(self.client)

    def server(self) -> tuple[str, int]:
        """Which Redis server the store talks to: ``(host, port)``."""
        kwargs = self.client.connection_pool.connection_kwargs
        return str(kwargs.get("host") or kwargs.get("path")), int(kwargs.get("port") or 0)

    def shares_server(self, host: str | None, port: int | None) -> bool:
        """Whether a client of ``host:port`` talks to the store's Redis server (any
        database; ``localhost`` is the loopback address)."""

        def loopback(name: str | None) -> str:
            return "127.0.0.1" if name in (None, "", "localhost") else str(name)

        name, own_port = self.server()
        return (loopback(host), int(port or 0)) == (loopback(name), own_port)

    def unreserve(self, key: str, job_id: str) -> None:
        self._unreserve(keys=[keys.dedup(key, self.prefix)], args=[job_id])

    def key_state(self, key: str) -> KeyState:
        pipe = self.client.pipeline(transaction=True)
        dedup, ledger = keys.dedup(key, self.prefix), keys.ledger(key, self.prefix)
        pipe.get(dedup)
        pipe.pttl(dedup)
        pipe.hmget(ledger, "state", "owner", "outcome")
        pipe.pttl(ledger)
        holder, reserved_ms, entry, entry_ms = pipe.execute()
        return _key_state(key, [holder, reserved_ms, *entry, entry_ms])

    def clear_key(self, key: str, *, audit: AuditEvent | None = None) -> KeyState:
        audit_keys, audit_args = self._audit_parts(audit)
        found = self._clear_key(
            keys=[keys.dedup(key, self.prefix), keys.ledger(key, self.prefix), *audit_keys],
            args=audit_args,
        )
        return _key_state(key, list(found))

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
        audit_keys, audit_args = self._audit_parts(audit)
        script, keys_, args = self._riding(self._claim, self._claim_with_result, result)
        status, holder, outcome, count = cast(
            "list[Any]",
            script(
                keys=[
                    *keys_,
                    keys.ledger(key, self.prefix),
                    keys.deliveries(delivery_id, self.prefix),
                    *audit_keys,
                ],
                args=[*args, owner, _ms(lease), _ms(self.delivery_ttl), *audit_args],
            ),
        )
        return Claim(ClaimStatus(status), holder=holder, deliveries=int(count), outcome=outcome)

    def renew(self, key: str, owner: str, lease: float) -> bool:
        renewed = self._renew(keys=[keys.ledger(key, self.prefix)], args=[owner, _ms(lease)])
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
    ) -> None:
        """``result``: Celery's SUCCESS write, sent in the same script."""
        audit_keys, audit_args = self._audit_parts(audit)
        script, keys_, args = self._riding(self._complete, self._complete_with_result, result)
        script(
            keys=[*keys_, keys.ledger(key, self.prefix), keys.dedup(key, self.prefix), *audit_keys],
            args=[
                *args, owner, outcome, _ms(keep), *self._reservation(reserved_by), *audit_args,
            ],
        )  # fmt: skip

    def release(self, key: str, owner: str, reserved_by: str | None) -> None:
        self._release(
            keys=[keys.ledger(key, self.prefix), keys.dedup(key, self.prefix)],
            args=[owner, "", 0, *self._reservation(reserved_by)],
        )

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
