"""The coordination part of the Redis store: named leases, token buckets, state records.

A lease is one key holding its owner, with an expiry (``PX``); taking, renewing and
releasing it are Lua scripts, so only the holder can extend or drop it. A token bucket is
a hash stepped by one script on Redis' own clock (``TIME``), so workers need no shared
clock for rate limits. :class:`RedisCoordination` is a part of
:class:`~conventions.store.redis.RedisStore`, not a store on its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import redis

from conventions.store import keys

#: KEYS: lease. ARGV: owner, ttl ms. Takes a free lease or extends the owner's own;
#: returns the holder otherwise.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""

#: KEYS: lease. ARGV: owner, ttl ms. Returns 1 when the lease was ours and extended.
_RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

#: KEYS: a key. ARGV: a value. Deletes the key only while it holds that value (a lease
#: released by its owner, a reservation dropped by its job); returns 1 when it did.
DELETE_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: KEYS: the leases, in order. ARGV: owner, ttl ms. Takes the first free one (or the
#: owner's own); returns its 1-based index, 0 when every one is held by others.
_ACQUIRE_ANY = """
for i, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if not holder or holder == ARGV[1] then
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
    return i
  end
end
return 0
"""

#: The bucket step of ``conventions.store.tokens`` on Redis' own clock. Times are
#: written with ``%.6f`` and returned as strings (Lua numbers become integers in a reply).
_BUCKET = """
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function save(key, tat, use, paused, at)
  redis.call('HSET', key, 'tat', string.format('%.6f', tat),
             'use', string.format('%.6f', use), 'paused', string.format('%.6f', paused))
  local idle = math.max(tat, use, paused) - at + 60
  redis.call('PEXPIRE', key, math.ceil(idle * 1000))
end
local function waiting(wait)
  -- never '0.000000' for a wait above 0: the caller would take it for a token taken
  return string.format('%.6f', math.max(wait, 0.000001))
end
local b = redis.call('HMGET', KEYS[1], 'tat', 'use', 'paused')
local old_tat, old_use = tonumber(b[1]) or 0, tonumber(b[2]) or 0
local paused = tonumber(b[3]) or 0
"""

#: KEYS: bucket. ARGV: interval, burst, max wait, booked ('1' or '0'). Returns the wait.
_TAKE_TOKEN = (
    _BUCKET
    + """
local at = now()
local interval, max_wait = tonumber(ARGV[1]), tonumber(ARGV[3])
local slack = (math.max(tonumber(ARGV[2]), 1) - 1) * interval
local tat, use = math.max(old_tat, at), math.max(old_use, at)
local free_at = math.max(use - slack, paused)
local wait
if ARGV[4] == '1' then
  wait = free_at - at
else
  local sched = math.max(tat, paused)
  wait = math.max(sched - slack, free_at) - at
  if wait > max_wait then return waiting(wait) end
  tat = sched + interval
end
if wait <= 0 then
  save(KEYS[1], tat, use + interval, paused, at)
  return '0'
end
save(KEYS[1], tat, old_use, paused, at)
return waiting(wait)
"""
)

#: KEYS: bucket. ARGV: seconds. Extends the pause to at least that long from now.
_PAUSE_TOKENS = (
    _BUCKET
    + """
local at = now()
save(KEYS[1], old_tat, old_use, math.max(paused, at + tonumber(ARGV[1])), at)
return 1
"""
)


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1 (``PX 0`` is an error in Redis)."""
    return max(1, math.ceil(seconds * 1000))


class RedisCoordination(keys.Scoped):
    """Leases, token buckets and small state records: the methods of
    :class:`~conventions.store.redis.RedisStore` that coordinate workers."""

    client: redis.Redis
    prefix: str

    def _lease(self, name: str) -> str:
        """The key of lease ``name`` (the slots of one limit share a partition)."""
        return keys.lease(name, self._scope(keys.lease_source(name)))

    def _state(self, name: str) -> str:
        return keys.state(name, self._scope(name))

    def _register_coordination(self) -> None:
        """Register this part's scripts (run by ``EVALSHA``)."""
        register = self.client.register_script
        self._acquire = register(_ACQUIRE)
        self._renew_lease = register(_RENEW_LEASE)
        self._release_lease = register(DELETE_IF_HELD)
        self._acquire_any = register(_ACQUIRE_ANY)
        self._take_token = register(_TAKE_TOKEN)
        self._pause_tokens = register(_PAUSE_TOKENS)

    # -- leases ---------------------------------------------------------------------------
    def acquire(self, name: str, owner: str, ttl: float) -> str | None:
        holder = self._acquire(keys=[self._lease(name)], args=[owner, _ms(ttl)])
        return None if not holder else cast(str, holder)

    def renew_lease(self, name: str, owner: str, ttl: float) -> bool:
        return bool(
            self._renew_lease(
                keys=[self._lease(name)],
                args=[owner, _ms(ttl)],
            )
        )

    def release_lease(self, name: str, owner: str) -> bool:
        return bool(self._release_lease(keys=[self._lease(name)], args=[owner]))

    def lease_holder(self, name: str) -> str | None:
        return cast(str | None, self.client.get(self._lease(name)))

    def acquire_any(self, names: Sequence[str], owner: str, ttl: float) -> str | None:
        """One script tries every lease in order: one round trip however many slots."""
        if not names:
            return None
        leases = [self._lease(name) for name in names]
        index = int(cast(int, self._acquire_any(keys=leases, args=[owner, _ms(ttl)])))
        return names[index - 1] if index else None

    # -- token buckets ----------------------------------------------------------------------
    def take_token(
        self, name: str, interval: float, burst: int, max_wait: float, booked: bool
    ) -> float:
        wait = self._take_token(
            keys=[keys.bucket(name, self._scope(name))],
            args=[repr(float(interval)), int(burst), repr(float(max_wait)), int(booked)],
        )
        return max(0.0, float(cast(str, wait)))

    def pause_tokens(self, name: str, seconds: float) -> None:
        self._pause_tokens(keys=[keys.bucket(name, self._scope(name))], args=[repr(float(seconds))])

    # -- small state records ------------------------------------------------------------
    def put_state(self, name: str, value: Mapping[str, Any], ttl: float | None) -> None:
        data = json.dumps(dict(value), separators=(",", ":"), default=str)
        self.client.set(self._state(name), data, px=None if ttl is None else _ms(ttl))

    def get_state(self, name: str) -> dict[str, Any] | None:
        data = self.client.get(self._state(name))
        return None if data is None else cast(dict[str, Any], json.loads(data))

    def get_states(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The documents of those of ``names`` that exist, in one ``MGET`` (on Redis
        Cluster, one per hash slot: redis-py's ``mget_nonatomic``)."""
        wanted = list(names)
        if not wanted:
            return {}
        keys = [self._state(name) for name in wanted]
        many = getattr(self.client, "mget_nonatomic", None)
        found = many(keys) if many is not None else self.client.mget(keys)
        return {name: cast(dict[str, Any], json.loads(data))
                for name, data in zip(wanted, found, strict=True) if data is not None}  # fmt: skip

    def delete_state(self, name: str) -> None:
        self.client.delete(self._state(name))
