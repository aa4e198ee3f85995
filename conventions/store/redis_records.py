"""The records part of the Redis store: dead letters and audit trails.

A dead-letter record is a hash indexed by time in sorted sets (all, by task, by
category, by both); an audit trail is a list per correlation id, indexed by the time of
its last event. Purges walk an index oldest first in batches, each batch one script.

The dead-letter and audit scripts build some key names at run time (the indexes a record
was in, the records of a purge batch), so this store targets one Redis node (or a
replicated primary), not Redis Cluster. :class:`RedisRecords` is a part of
:class:`~conventions.store.redis.RedisStore`, not a store on its own.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import cast

import redis
from redis.commands.core import Script

from conventions import counts, keys
from conventions.records import AuditEvent, Category, DeadLetter

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

#: how many records or correlation ids one purge script call handles (bounds the time
#: Redis spends in one script)
PURGE_BATCH = 500


def _score(moment: datetime) -> str:
    """A sorted-set score: POSIX seconds, exact (``repr``); naive times are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return repr(moment.timestamp())


class RedisRecords:
    """Dead letters and audit trails: the methods of
    :class:`~conventions.store.redis.RedisStore` that keep records."""

    client: redis.Redis
    prefix: str
    audit_ttl: float

    def _register_records(self) -> None:
        """Register this part's scripts (run by ``EVALSHA``)."""
        register = self.client.register_script
        self._put_dead_letter = register(_PUT_DEAD_LETTER)
        self._delete_dead_letter = register(_DELETE_DEAD_LETTER)
        self._purge_dead_letters = register(_PURGE_DEAD_LETTERS)
        self._list_dead_letters = register(_LIST_DEAD_LETTERS)
        self._purge_audit = register(_PURGE_AUDIT)

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
