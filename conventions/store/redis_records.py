"""The records part of the Redis store: dead letters and audit trails.

A dead-letter record is a hash indexed by time in sorted sets (all, by task, by
category, by both); an audit trail is a list per correlation id, indexed by the time of
its last event. Purges walk an index oldest first in batches, each batch one script.

The audit trail shares a Redis that runs ``noeviction`` (often the broker's), so its
size is bounded, not only its age: each event is kept in the compact form
(:meth:`~conventions.store.records.AuditEvent.to_compact`, a job's fields once per job: about
900 bytes for a job's trail, index included, see :data:`AUDIT_BYTES_PER_JOB`), a trail
keeps its newest :data:`AUDIT_MAX_EVENTS` events, and beyond :data:`AUDIT_MAX_TRAILS`
trails the ones idle longest are dropped as new ones come.

Some scripts build key names at run time from a prefix they are given (the indexes a
record was in, the records of a purge batch or a listing, the oldest trail beyond the
cap): on Redis Cluster that prefix carries the partition's hash tag, so every name a
script builds hashes to the slot of the keys it declares, and runs on that shard. The
fleet-wide readers (listings, counts, counters, purges, a correlation's trail) visit
each partition (:meth:`_scopes`: one on one node) and merge. :class:`RedisRecords` is a
part of :class:`~conventions.store.redis.RedisStore`, not a store on its own.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any, cast

import redis
from redis.commands.core import Script

from conventions.store import counts, keys
from conventions.store.batches import BatchMove
from conventions.store.records import SWAP_TRIES, AuditEvent, Category, DeadLetter, replayed_copy
from conventions.store.redis_audit import AUDIT, _compact, _events
from conventions.store.redis_batches import RedisBatches, with_batch
from conventions.store.redis_runs import RedisRuns

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

#: KEYS: record. ARGV: the data it is expected to hold, the data to put instead. Returns 1
#: when it held it (and now holds the new data), else 0: a compare-and-set of the whole
#: record, so no field is re-encoded here.
_SWAP_DEAD_LETTER = """
if redis.call('HGET', KEYS[1], 'data') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[2])
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
#: what one job's trail (published, started, succeeded, ids of usual lengths) takes in
#: Redis, its index entry and expiry included, rounded up: 771 bytes by ``MEMORY USAGE``
#: and 846 to 874 by ``INFO memory`` over 10,000 jobs on Redis 7 (the full JSON form:
#: 1,603 and about 1,700); ``tests/integration/test_audit_bounds.py`` holds it to a budget
AUDIT_BYTES_PER_JOB = 900

#: KEYS: trail, by-time index, counters. ARGV: the audit args (see :data:`AUDIT`).
_ADD_AUDIT = AUDIT + "record_audit()\nreturn 1\n"


def _job_of(event: AuditEvent) -> str:
    """What an event's partition is chosen by on a cluster: its job's namespaced key, as
    the ledger's (its task id when it has none)."""
    if event.idempotency_key:
        return keys.namespaced(event.task, event.idempotency_key)
    return event.task_id


def _score(moment: datetime) -> str:
    """A sorted-set score: POSIX seconds, exact (``repr``); naive times are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return repr(moment.timestamp())


class RedisRecords(RedisRuns, RedisBatches):
    """Dead letters and audit trails: the methods of
    :class:`~conventions.store.redis.RedisStore` that keep records."""

    client: redis.Redis
    prefix: str
    audit_ttl: float
    #: the caps of :data:`AUDIT` (0: none)
    audit_max_trails: int
    audit_max_events: int

    def _register_records(self) -> None:
        """Register this part's scripts (run by ``EVALSHA``)."""
        register = self.client.register_script
        self._put_dead_letter = register(_PUT_DEAD_LETTER)
        self._put_dead_letter_batch = register(with_batch(_PUT_DEAD_LETTER))
        self._swap_dead_letter = register(_SWAP_DEAD_LETTER)
        self._delete_dead_letter = register(_DELETE_DEAD_LETTER)
        self._purge_dead_letters = register(_PURGE_DEAD_LETTERS)
        self._list_dead_letters = register(_LIST_DEAD_LETTERS)
        self._purge_audit = register(_PURGE_AUDIT)
        self._add_audit = register(_ADD_AUDIT)
        self._register_runs()

    # -- dead letters -------------------------------------------------------------------
    def put_dead_letter(self, record: DeadLetter, *, batch: BatchMove | None = None) -> list[str]:
        """``batch``: the member's end (failed), moved in the same script; answers the
        batch callbacks it made due."""
        p = self._scope(record.id)
        indexes = keys.dead_letter_indexes(record.task, str(record.category), p)
        script, keys_, args = self._put_dead_letter, list[str](), list[Any]()
        if batch is not None:
            script = self._put_dead_letter_batch
            keys_, args = self._batch_parts(batch)
        answer: Any = script(
            keys=[*keys_, keys.dead_letter(record.id, p), *indexes],
            args=[
                *args,
                record.id,
                json.dumps(record.to_dict()),
                _score(record.last_failed_at),
                json.dumps(indexes),
            ],
        )
        return [] if batch is None else [str(due) for due in answer[1]]

    def get_dead_letter(self, record_id: str) -> DeadLetter | None:
        data = self.client.hget(keys.dead_letter(record_id, self._scope(record_id)), "data")
        return None if data is None else DeadLetter.from_dict(json.loads(cast(str, data)))

    def swap_replayed_at(self, record_id: str, seen: datetime | None, at: datetime | None) -> bool:
        record = keys.dead_letter(record_id, self._scope(record_id))
        for _ in range(SWAP_TRIES):  # the record may change meanwhile (a new failure)
            raw = cast("str | None", self.client.hget(record, "data")) or ""
            data = replayed_copy(raw, seen, at) if raw else None
            if data is None:
                return False
            if self._swap_dead_letter(keys=[record], args=[raw, data]):
                return True
        return False

    def list_dead_letters(
        self,
        task: str | None = None,
        category: Category | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[DeadLetter]:
        """One script: the matching index, newest first, then those records only (on a
        cluster, one per partition, merged)."""
        if limit <= 0:
            return []
        found: list[DeadLetter] = []
        for p in self._scopes():
            index = keys.dead_letters_index(
                task=task, category=None if category is None else str(category), prefix=p
            )
            part = self._list_dead_letters(
                keys=[index],
                args=[keys.dead_letter("", p), "-inf" if since is None else _score(since), limit],
            )
            found += [DeadLetter.from_dict(json.loads(data)) for data in cast("list[str]", part)]
        if not self.clustered:
            return found
        found.sort(key=lambda record: (record.last_failed_at, record.id), reverse=True)
        return found[:limit]

    def count_dead_letters(self) -> int:
        indexes = [keys.dead_letters_index(prefix=p) for p in self._scopes()]
        return sum(int(n) for n in self._each("ZCARD", indexes))

    def delete_dead_letter(self, record_id: str) -> bool:
        p = self._scope(record_id)
        removed = self._delete_dead_letter(
            keys=[keys.dead_letters_index(prefix=p), keys.dead_letter(record_id, p)],
            args=[record_id],
        )
        return bool(removed)

    def purge_dead_letters(self, older_than: datetime) -> int:
        """Batches of :data:`PURGE_BATCH` records, oldest first, each batch atomic."""
        return sum(
            self._purge(
                self._purge_dead_letters,
                keys.dead_letters_index(prefix=p),
                keys.dead_letter("", p),
                older_than,
            )
            for p in self._scopes()
        )

    # -- audit trail --------------------------------------------------------------------
    def add_audit(self, event: AuditEvent) -> None:
        """The same script step as an event that rides with a ledger change (append,
        expiry, index, caps, counters): one round trip."""
        job = _job_of(event) if self.clustered else None  # one node: the plain prefix
        audit_keys, audit_args = self._audit_parts(event, self._scope(job))
        self._add_audit(keys=audit_keys, args=audit_args)

    def _audit_parts(self, event: AuditEvent | None, p: str) -> tuple[list[str], list[Any]]:
        """The trailing KEYS and ARGV of a script that records ``event`` (or nothing),
        under the prefix ``p`` of the job's keys (:meth:`_scope`)."""
        by_time, counted = keys.audit_by_time(p), keys.counts(p)
        if event is None:
            return [by_time, by_time, counted], ["", "", 1, 0, "", "[]", "", 0, 0, ""]
        trail = keys.audit(event.correlation_id, p)
        ttl = max(1, math.ceil(self.audit_ttl))
        # the amounts as strings: ``HINCRBY`` takes them as they are (a Lua number would be
        # formatted back to a string by Redis, call by call)
        moved = json.dumps([str(item) for pair in counts.fields(event).items() for item in pair])
        return [trail, by_time, counted], [
            *_compact(event), ttl, _score(event.at), event.correlation_id, moved,
            keys.audit("", p), self.audit_max_events, self.audit_max_trails,
            self._run_arg(event, p),
        ]  # fmt: skip

    def audit_for(self, correlation_id: str) -> list[AuditEvent]:
        """The trail in event time order (append order among equal times). On a
        cluster a correlation's jobs may sit in several partitions: one ``LRANGE`` per
        partition, pipelined by node (a job's events are all in one)."""
        scopes = self._scopes()
        if len(scopes) == 1:
            found = [self.client.lrange(keys.audit(correlation_id, scopes[0]), 0, -1)]
        else:
            pipe = self.client.pipeline(transaction=False)
            for p in scopes:
                pipe.lrange(keys.audit(correlation_id, p), 0, -1)
            found = pipe.execute()
        events = [e for part in found for e in _events(cast("list[str]", part), correlation_id)]
        return sorted(events, key=lambda event: event.at)

    def counters(self) -> dict[tuple[str, str], int]:
        """Every counter the audit events moved (one ``HGETALL``; on a cluster one per
        partition, summed)."""
        total: dict[tuple[str, str], int] = {}
        for found in self._each("HGETALL", [keys.counts(p) for p in self._scopes()]):
            for name, value in cast("dict[str, str]", found).items():
                split = counts.split(name)
                total[split] = total.get(split, 0) + int(value)
        return total

    def purge_audit(self, older_than: datetime) -> int:
        """Drops whole trails whose last event is before ``older_than``; counts events."""
        return sum(
            self._purge(self._purge_audit, keys.audit_by_time(p), keys.audit("", p), older_than)
            for p in self._scopes()
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
