"""The Redis store: one round trip and one atomic step per ledger operation.

Every rule that must hold under concurrency lives in Redis itself: the enqueue
reservation is ``SET NX GET``, and ``claim`` / ``renew`` / ``complete`` / ``release`` are
Lua scripts (registered once, run by ``EVALSHA``), so no two workers can both read "free"
and both write "mine". Leases are key expiries (``PX``): a worker that dies simply lets
its ledger entry vanish and the next claim takes over. Key names are in
:mod:`conventions.keys`. Needs Redis 7.0 or later (``SET NX GET``, ``ZADD GT``).

The dead-letter and audit scripts build some key names at run time (the indexes a record
was in, the records of a purge batch), so this store targets one Redis node (or a
replicated primary), not Redis Cluster.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import redis
from redis.commands.core import Script

from conventions import counts, keys
from conventions.records import AuditEvent, Category, Claim, ClaimStatus, DeadLetter

#: Appends an audit event in the same script as the state change it records, and moves
#: its counters (:mod:`conventions.counts`). Every script that uses it takes the audit
#: trail, the by-time index and the counters hash as its last three KEYS and (event JSON
#: or '', trail ttl s, score, correlation id, counter fields JSON [field, n, ...]) as its
#: last five ARGV.
_AUDIT = """
local function record_audit()
  local event = ARGV[#ARGV - 4]
  if event == '' then return end
  redis.call('RPUSH', KEYS[#KEYS - 2], event)
  redis.call('EXPIRE', KEYS[#KEYS - 2], ARGV[#ARGV - 3])
  redis.call('ZADD', KEYS[#KEYS - 1], 'GT', ARGV[#ARGV - 2], ARGV[#ARGV - 1])
  local counts = cjson.decode(ARGV[#ARGV])
  for i = 1, #counts, 2 do
    redis.call('HINCRBY', KEYS[#KEYS], counts[i], counts[i + 1])
  end
end
"""

#: KEYS: dedup, audit keys. ARGV: job id, ttl ms or '', audit args.
#: Returns the holder's job id, or false when the reservation is ours (the audit event
#: is recorded only when this call made the reservation).
_RESERVE = (
    _AUDIT
    + """
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
"""
)

#: KEYS: ledger, deliveries, audit keys. ARGV: owner, lease ms, delivery ttl
#: ms, audit args. Returns {status, holder, outcome, deliveries}; the audit event is
#: recorded only on a claim.
_CLAIM = (
    _AUDIT
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

#: KEYS: dedup. ARGV: job id. Drops the reservation only if that job still holds it.
_UNRESERVE_ONLY = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
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
#: event is recorded either way. Returns 1 when done was recorded.
_COMPLETE = (
    _AUDIT
    + """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner')
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

#: Removes one dead-letter record and its index entries; returns 1 if it existed.
_DROP_RECORD = """
local function drop(record_key, id, all_index)
  local indexes = redis.call('HGET', record_key, 'indexes')
  redis.call('ZREM', all_index, id)
  if not indexes then
    return 0
  end
  for _, index in ipairs(cjson.decode(indexes)) do
    redis.call('ZREM', index, id)
  end
  redis.call('DEL', record_key)
  return 1
end
"""

#: KEYS: record, new indexes... ARGV: id, data JSON, score, indexes JSON.
#: An overwrite first leaves the indexes of the previous version (task or category
#: may have changed).
_PUT_DEAD_LETTER = """
local old = redis.call('HGET', KEYS[1], 'indexes')
if old then
  for _, index in ipairs(cjson.decode(old)) do
    redis.call('ZREM', index, ARGV[1])
  end
end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'indexes', ARGV[4])
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[i], ARGV[3], ARGV[1])
end
return 1
"""

#: KEYS: all index, record. ARGV: id.
_DELETE_DEAD_LETTER = _DROP_RECORD + "return drop(KEYS[2], ARGV[1], KEYS[1])\n"

#: KEYS: all index. ARGV: record key prefix, max score (exclusive form), batch size.
#: Returns {ids seen, records removed}; the caller loops while a batch comes back full.
_PURGE_DEAD_LETTERS = (
    _DROP_RECORD
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local removed = 0
for _, id in ipairs(ids) do
  removed = removed + drop(ARGV[1] .. id, id, KEYS[1])
end
return {#ids, removed}
"""
)

#: KEYS: index. ARGV: record key prefix, min score, limit. Newest first, one round trip.
_LIST_DEAD_LETTERS = """
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local out = {}
for _, id in ipairs(ids) do
  local data = redis.call('HGET', ARGV[1] .. id, 'data')
  if data then
    out[#out + 1] = data
  end
end
return out
"""

#: KEYS: correlation index. ARGV: list key prefix, max score (exclusive form), batch.
#: Returns {correlation ids seen, events removed}.
_PURGE_AUDIT = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local removed = 0
for _, id in ipairs(ids) do
  local key = ARGV[1] .. id
  removed = removed + redis.call('LLEN', key)
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[1], id)
end
return {#ids, removed}
"""

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

#: KEYS: lease. ARGV: owner. Returns 1 when the lease was ours and is released.
_RELEASE_LEASE = """
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
  if wait > max_wait then return string.format('%.6f', wait) end
  tat = sched + interval
end
if wait <= 0 then
  save(KEYS[1], tat, use + interval, paused, at)
  return '0'
end
save(KEYS[1], tat, old_use, paused, at)
return string.format('%.6f', wait)
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

#: how many records or correlation ids one purge script call handles (bounds the time
#: Redis spends in one script)
PURGE_BATCH = 500


def _score(moment: datetime) -> str:
    """A sorted-set score: POSIX seconds, exact (``repr``); naive times are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return repr(moment.timestamp())


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1 (``PX 0`` is an error in Redis)."""
    return max(1, math.ceil(seconds * 1000))


class RedisStore:
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
        register = self.client.register_script
        self._reserve = register(_RESERVE)
        self._unreserve = register(_UNRESERVE_ONLY)
        self._claim = register(_CLAIM)
        self._renew = register(_RENEW)
        self._complete = register(_COMPLETE)
        self._release = register(_RELEASE)
        self._put_dead_letter = register(_PUT_DEAD_LETTER)
        self._delete_dead_letter = register(_DELETE_DEAD_LETTER)
        self._purge_dead_letters = register(_PURGE_DEAD_LETTERS)
        self._list_dead_letters = register(_LIST_DEAD_LETTERS)
        self._purge_audit = register(_PURGE_AUDIT)
        self._acquire = register(_ACQUIRE)
        self._renew_lease = register(_RENEW_LEASE)
        self._release_lease = register(_RELEASE_LEASE)
        self._acquire_any = register(_ACQUIRE_ANY)
        self._take_token = register(_TAKE_TOKEN)
        self._pause_tokens = register(_PAUSE_TOKENS)

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

    def unreserve(self, key: str, job_id: str) -> None:
        self._unreserve(keys=[keys.dedup(key, self.prefix)], args=[job_id])

    # -- execution ledger --------------------------------------------------------------
    def claim(
        self,
        key: str,
        owner: str,
        lease: float,
        delivery_id: str,
        *,
        audit: AuditEvent | None = None,
    ) -> Claim:
        audit_keys, audit_args = self._audit_parts(audit)
        status, holder, outcome, count = cast(
            "list[Any]",
            self._claim(
                keys=[
                    keys.ledger(key, self.prefix),
                    keys.deliveries(delivery_id, self.prefix),
                    *audit_keys,
                ],
                args=[owner, _ms(lease), _ms(self.delivery_ttl), *audit_args],
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
    ) -> None:
        audit_keys, audit_args = self._audit_parts(audit)
        self._complete(
            keys=[keys.ledger(key, self.prefix), keys.dedup(key, self.prefix), *audit_keys],
            args=[owner, outcome, _ms(keep), *self._reservation(reserved_by), *audit_args],
        )

    def release(self, key: str, owner: str, reserved_by: str | None) -> None:
        self._release(
            keys=[keys.ledger(key, self.prefix), keys.dedup(key, self.prefix)],
            args=[owner, "", 0, *self._reservation(reserved_by)],
        )

    def _audit_parts(self, event: AuditEvent | None) -> tuple[list[str], list[Any]]:
        """The trailing KEYS and ARGV of a script that records ``event`` (or nothing)."""
        by_time, counted = keys.audit_by_time(self.prefix), keys.counts(self.prefix)
        if event is None:
            return [by_time, by_time, counted], ["", 1, 0, "", "[]"]
        trail = keys.audit(event.correlation_id, self.prefix)
        ttl = max(1, math.ceil(self.audit_ttl))
        data = json.dumps(event.to_dict())
        moved = json.dumps([item for pair in counts.fields(event).items() for item in pair])
        return [trail, by_time, counted], [data, ttl, _score(event.at), event.correlation_id, moved]

    @staticmethod
    def _reservation(reserved_by: str | None) -> list[str]:
        return ["0", ""] if reserved_by is None else ["1", reserved_by]

    # -- dead letters -------------------------------------------------------------------
    def put_dead_letter(self, record: DeadLetter) -> None:
        indexes = keys.dead_letter_indexes(record.task, str(record.category), self.prefix)
        self._put_dead_letter(
            keys=[keys.dead_letter(record.id, self.prefix), *indexes],
            args=[
                record.id,
                json.dumps(record.to_dict()),
                _score(record.last_failed_at),
                json.dumps(indexes),
            ],
        )

    def get_dead_letter(self, record_id: str) -> DeadLetter | None:
        data = self.client.hget(keys.dead_letter(record_id, self.prefix), "data")
        return None if data is None else DeadLetter.from_dict(json.loads(cast(str, data)))

    def list_dead_letters(
        self,
        task: str | None = None,
        category: Category | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[DeadLetter]:
        """One script: the matching index, newest first, then those records only."""
        if limit <= 0:
            return []
        index = keys.dead_letters_index(
            task=task, category=None if category is None else str(category), prefix=self.prefix
        )
        found = self._list_dead_letters(
            keys=[index],
            args=[
                keys.dead_letter("", self.prefix),
                "-inf" if since is None else _score(since),
                limit,
            ],
        )
        return [DeadLetter.from_dict(json.loads(data)) for data in cast("list[str]", found)]

    def count_dead_letters(self) -> int:
        return self.client.zcard(keys.dead_letters_index(prefix=self.prefix))

    def delete_dead_letter(self, record_id: str) -> bool:
        removed = self._delete_dead_letter(
            keys=[
                keys.dead_letters_index(prefix=self.prefix),
                keys.dead_letter(record_id, self.prefix),
            ],
            args=[record_id],
        )
        return bool(removed)

    def purge_dead_letters(self, older_than: datetime) -> int:
        """Batches of :data:`PURGE_BATCH` records, oldest first, each batch atomic."""
        return self._purge(
            self._purge_dead_letters,
            keys.dead_letters_index(prefix=self.prefix),
            keys.dead_letter("", self.prefix),
            older_than,
        )

    # -- audit trail --------------------------------------------------------------------
    def add_audit(self, event: AuditEvent) -> None:
        """``RPUSH`` + ``EXPIRE`` + ``ZADD GT`` + ``HINCRBY`` (its counters) in one
        ``MULTI``: one round trip."""
        trail = keys.audit(event.correlation_id, self.prefix)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.rpush(trail, json.dumps(event.to_dict()))
            pipe.expire(trail, max(1, math.ceil(self.audit_ttl)))
            pipe.zadd(
                keys.audit_by_time(self.prefix),
                {event.correlation_id: float(_score(event.at))},
                gt=True,
            )
            for name, amount in counts.fields(event).items():
                pipe.hincrby(keys.counts(self.prefix), name, amount)
            pipe.execute()

    def audit_for(self, correlation_id: str) -> list[AuditEvent]:
        """The trail in event time order (append order among equal times)."""
        found = self.client.lrange(keys.audit(correlation_id, self.prefix), 0, -1)
        events = [AuditEvent.from_dict(json.loads(data)) for data in cast("list[str]", found)]
        return sorted(events, key=lambda event: event.at)

    def counters(self) -> dict[tuple[str, str], int]:
        """Every counter the audit events moved (one ``HGETALL``)."""
        found = cast("dict[str, str]", self.client.hgetall(keys.counts(self.prefix)))
        return {counts.split(name): int(value) for name, value in found.items()}

    def purge_audit(self, older_than: datetime) -> int:
        """Drops whole trails whose last event is before ``older_than``; counts events."""
        return self._purge(
            self._purge_audit,
            keys.audit_by_time(self.prefix),
            keys.audit("", self.prefix),
            older_than,
        )

    def _purge(self, script: Script, index: str, key_prefix: str, older_than: datetime) -> int:
        removed = 0
        while True:
            seen, dropped = cast(
                "list[int]",
                script(
                    keys=[index],
                    args=[key_prefix, f"({_score(older_than)}", PURGE_BATCH],
                ),
            )
            removed += int(dropped)
            if int(seen) < PURGE_BATCH:
                return removed

    # -- leases ---------------------------------------------------------------------------
    def acquire(self, name: str, owner: str, ttl: float) -> str | None:
        holder = self._acquire(keys=[keys.lease(name, self.prefix)], args=[owner, _ms(ttl)])
        return None if not holder else cast(str, holder)

    def renew_lease(self, name: str, owner: str, ttl: float) -> bool:
        return bool(self._renew_lease(keys=[keys.lease(name, self.prefix)], args=[owner, _ms(ttl)]))

    def release_lease(self, name: str, owner: str) -> bool:
        return bool(self._release_lease(keys=[keys.lease(name, self.prefix)], args=[owner]))

    def lease_holder(self, name: str) -> str | None:
        return cast(str | None, self.client.get(keys.lease(name, self.prefix)))

    def acquire_any(self, names: Sequence[str], owner: str, ttl: float) -> str | None:
        """One script tries every lease in order: one round trip however many slots."""
        if not names:
            return None
        leases = [keys.lease(name, self.prefix) for name in names]
        index = int(cast(int, self._acquire_any(keys=leases, args=[owner, _ms(ttl)])))
        return names[index - 1] if index else None

    # -- token buckets ----------------------------------------------------------------------
    def take_token(
        self, name: str, interval: float, burst: int, max_wait: float, booked: bool
    ) -> float:
        wait = self._take_token(
            keys=[keys.bucket(name, self.prefix)],
            args=[repr(float(interval)), int(burst), repr(float(max_wait)), int(booked)],
        )
        return max(0.0, float(cast(str, wait)))

    def pause_tokens(self, name: str, seconds: float) -> None:
        self._pause_tokens(keys=[keys.bucket(name, self.prefix)], args=[repr(float(seconds))])

    # -- small state records ------------------------------------------------------------
    def put_state(self, name: str, value: Mapping[str, Any], ttl: float | None) -> None:
        data = json.dumps(dict(value), separators=(",", ":"), default=str)
        self.client.set(keys.state(name, self.prefix), data, px=None if ttl is None else _ms(ttl))

    def get_state(self, name: str) -> dict[str, Any] | None:
        data = self.client.get(keys.state(name, self.prefix))
        return None if data is None else cast(dict[str, Any], json.loads(data))

    def delete_state(self, name: str) -> None:
        self.client.delete(keys.state(name, self.prefix))

    def close(self) -> None:
        if self._owns_client:
            self.client.close()
