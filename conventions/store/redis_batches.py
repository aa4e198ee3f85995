"""The batches part of the Redis store (:mod:`conventions.store.batches`).

A batch is two hashes, ``{p}batch:{id}`` (counters, callbacks' states, spec, when a
member last moved: ``moved_at``) and
``{p}batch-m:{id}`` (each member's state), indexed in ``{p}batches:all``; a callback made
due waits in ``{p}batches:due`` until it is marked sent. A member's end moves them in
the same script as the member's completion (``COMPLETE``) or dead letter: the script is
wrapped by :func:`with_batch`, which takes the batch's KEYS and ARGV from the front (as
:func:`~conventions.store.redis_results.with_result` does) and runs :data:`BATCH_END`
after it. A job that is in no batch runs the plain script: no key, no byte more.

Every key of a batch is declared. On Redis Cluster a batch tree's keys and its members'
job keys share its root's partition (:func:`conventions.store.keys.batch_home`): one
batch is one slot, so its throughput is one shard's.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

from conventions.store import batches as b
from conventions.store import keys

#: Lua: ``batch_end(bk, levels, member, outcome, task_id, dead)``: moves ``member`` of
#: the batch whose hash and members are bk[1], bk[2] (then its parent's, bk[3], bk[4], and
#: so on, ``levels`` of them; the due index last) to ``outcome``, once; on the batch's end,
#: makes its callbacks due and moves the batch's own entry in its parent. Answers the
#: callbacks it made due, as ``<batch id>|<callback>``.
BATCH_END = f"""
local function batch_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function batch_end(bk, levels, member, outcome, task_id, dead)
  local fired = {{}}
  local due = bk[2 * levels + 1]
  for level = 1, levels do
    local batch, members = bk[2 * level - 1], bk[2 * level]
    local entry = redis.call('HGET', members, member)
    if not entry then return fired end
    local state = string.sub(entry, 1, 1)
    local before = nil
    if state == '{b.PENDING}' and (outcome == '{b.SUCCEEDED}' or outcome == '{b.FAILED}') then
      before = 'pending'
    elseif state == '{b.FAILED}' and outcome == '{b.SUCCEEDED}' then
      before = 'failed'
    else
      return fired
    end
    redis.call('HSET', members, member, outcome .. '|' .. task_id .. '|' .. dead)
    redis.call('HINCRBY', batch, before, -1)
    redis.call('HINCRBY', batch, outcome == '{b.SUCCEEDED}' and 'succeeded' or 'failed', 1)
    local now = batch_now()
    redis.call('HSET', batch, 'moved_at', now)
    local s = redis.call('HMGET', batch, 'pending', 'failed', 'on_success', 'on_complete',
      'ended_at', 'id')
    local pending, failed = tonumber(s[1]), tonumber(s[2])
    if pending > 0 then return fired end
    if not s[5] or s[5] == '' then redis.call('HSET', batch, 'ended_at', now) end
    if s[4] == '{b.WAITING}' then
      redis.call('HSET', batch, 'on_complete', '{b.DUE}')
      redis.call('ZADD', due, now, s[6] .. '|{b.ON_COMPLETE}')
      table.insert(fired, s[6] .. '|{b.ON_COMPLETE}')
    end
    if failed == 0 and s[3] == '{b.WAITING}' then
      redis.call('HSET', batch, 'on_success', '{b.DUE}')
      redis.call('ZADD', due, now, s[6] .. '|{b.ON_SUCCESS}')
      table.insert(fired, s[6] .. '|{b.ON_SUCCESS}')
    end
    member, task_id, dead = '{b.NESTED}' .. s[6], '', ''
    outcome = failed == 0 and '{b.SUCCEEDED}' or '{b.FAILED}'
  end
  return fired
end
"""


def with_batch(script: str) -> str:
    """``script`` followed by a member's end (:data:`BATCH_END`), in one script. KEYS
    start with the batches' hash and members (innermost first) and the due index; ARGV
    with how many batches, the member, its outcome, its task id and its dead-letter id.
    ``script`` sees KEYS and ARGV without them; answers ``{its answer, callbacks due}``."""
    return (
        BATCH_END
        + """
local batch_levels = tonumber(table.remove(ARGV, 1))
local batch_member = table.remove(ARGV, 1)
local batch_outcome = table.remove(ARGV, 1)
local batch_task = table.remove(ARGV, 1)
local batch_dead = table.remove(ARGV, 1)
local batch_keys = {}
for i = 1, 2 * batch_levels + 1 do batch_keys[i] = table.remove(KEYS, 1) end
local answer = (function()
"""
        + script
        + """
end)()
local fired = batch_end(batch_keys, batch_levels, batch_member, batch_outcome, batch_task,
  batch_dead)
return {answer or 0, fired}
"""
    )


#: KEYS: batch, members, all index. ARGV: id, spec JSON, parent id or '', on_success
#: state, on_complete state, the members. Creates the batch unless it exists; 1 if made.
_CREATE = f"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = #ARGV - 5
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'spec', ARGV[2], 'parent', ARGV[3], 'total', n,
  'pending', n, 'succeeded', 0, 'failed', 0, 'published', 0, 'created_at', now,
  'on_success', ARGV[4], 'on_complete', ARGV[5])
local chunk = {{}}
for i = 6, #ARGV do
  table.insert(chunk, ARGV[i])
  table.insert(chunk, '{b.PENDING}||')
  if #chunk >= 1000 then
    redis.call('HSET', KEYS[2], unpack(chunk))
    chunk = {{}}
  end
end
if #chunk > 0 then redis.call('HSET', KEYS[2], unpack(chunk)) end
redis.call('ZADD', KEYS[3], now, ARGV[1])
return 1
"""

#: KEYS: batch, due index. ARGV: id, callback. Marks a due callback sent.
_SENT = f"""
if redis.call('HGET', KEYS[1], ARGV[2]) == '{b.DUE}' then
  redis.call('HSET', KEYS[1], ARGV[2], '{b.SENT}')
end
redis.call('ZREM', KEYS[2], ARGV[1] .. '|' .. ARGV[2])
return 1
"""

#: KEYS: due index. ARGV: grace seconds, how many. The callbacks due for longer than
#: the grace, on the server's clock.
_DUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0,
  tonumber(ARGV[2]))
"""

#: ARGV: prefix, cutoff (POSIX seconds), the candidate ids. Deletes each batch that ended
#: before the cutoff with no callback left due (its hash, members, index entry); how many.
_PURGE = f"""
local prefix, cutoff, removed = ARGV[1], tonumber(ARGV[2]), 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local batch = prefix .. '{keys.BATCH}' .. id
  local s = redis.call('HMGET', batch, 'ended_at', 'on_success', 'on_complete')
  if not s[2] then  -- gone: only its index entry was left
    redis.call('ZREM', KEYS[1], id)
  elseif s[1] and tonumber(s[1]) < cutoff and s[2] ~= '{b.DUE}' and s[3] ~= '{b.DUE}' then
    redis.call('DEL', batch, prefix .. '{keys.BATCH_MEMBERS}' .. id)
    redis.call('ZREM', KEYS[1], id)
    removed = removed + 1
  end
end
return removed
"""

#: a member's end, by itself (a member that ended without a completion of its own: its
#: key was done already, or its body skipped)
_END_ALONE = with_batch("return 0")


class RedisBatches(keys.Scoped):
    """Batches on one Redis node or a Redis Cluster (a part of
    :class:`~conventions.store.redis.RedisStore`). On a cluster a batch tree's keys are
    in its root's partition (:func:`keys.batch_source`), and so are its members' job keys
    while they run (:func:`keys.batch_home`): one slot for every script that ends a
    member. A nested batch's root is found by ``{p}batch-home:{id}`` in its own
    partition; the indexes (``batches:all``, ``batches:due``) exist once per partition."""

    def _register_batches(self) -> None:
        register = self.client.register_script
        self._batch_create = register(_CREATE)
        self._batch_sent = register(_SENT)
        self._batch_due = register(_DUE)
        self._batch_end = register(_END_ALONE)
        self._batch_purge = register(_PURGE)

    def _tree(self, root: str) -> str:
        """The prefix of the keys of batch tree ``root`` (the plain prefix on one node)."""
        return self._scope(keys.batch_source(root))

    def _root_of(self, batch_id: str) -> str:
        """The root of batch ``batch_id``'s tree: itself, or on a cluster the one its
        home names when it is nested (one read)."""
        if not self.clustered:
            return batch_id
        root = self.client.get(f"{self._tree(batch_id)}{keys.BATCH_HOME}{batch_id}")
        return str(root) if root else batch_id

    def _batch_scope(self, batch_id: str) -> str:
        """The prefix of batch ``batch_id``'s keys: its tree's."""
        return self._tree(self._root_of(batch_id))

    def _batch_parts(self, move: b.BatchMove) -> tuple[list[str], list[Any]]:
        """The leading KEYS and ARGV of a script made by :func:`with_batch`."""
        p = self._tree(move.chain[-1])
        keys_: list[str] = []
        for batch_id in move.chain:
            keys_ += [keys.batch(batch_id, p), keys.batch_members(batch_id, p)]
        keys_.append(f"{p}{keys.BATCHES_DUE}")
        args = [len(move.chain), move.member, move.outcome, move.task_id, move.dead_letter_id]
        return keys_, args

    def create_batch(self, spec: b.BatchSpec) -> bool:
        root = spec.root or spec.id
        if self.clustered and spec.parent and not spec.root:  # a spec that does not say
            root = self._root_of(spec.parent)
        p = self._tree(root)
        if self.clustered and root != spec.id:  # the home first: a made batch is found
            self.client.set(f"{self._tree(spec.id)}{keys.BATCH_HOME}{spec.id}", root)
        states = [b.WAITING if which in spec.callbacks else b.NO_CALLBACK for which in b.CALLBACKS]
        made = self._batch_create(
            keys=[keys.batch(spec.id, p), keys.batch_members(spec.id, p), p + keys.BATCHES_ALL],
            args=[spec.id, spec.document(), spec.parent or "", *states, *spec.members],
        )
        return bool(made)

    def mark_batch_published(self, batch_id: str) -> None:
        self.client.hset(keys.batch(batch_id, self._batch_scope(batch_id)), "published", 1)

    def end_member(self, move: b.BatchMove) -> list[str]:
        keys_, args = self._batch_parts(move)
        _, fired = cast("list[Any]", self._batch_end(keys=keys_, args=args))
        return list(fired)

    def callback_sent(self, batch_id: str, which: str) -> None:
        p = self._batch_scope(batch_id)
        self._batch_sent(
            keys=[keys.batch(batch_id, p), p + keys.BATCHES_DUE], args=[batch_id, which]
        )

    def due_callbacks(self, grace: float, limit: int = 100) -> list[str]:
        found: list[str] = []
        for p in self._scopes():  # one on one node; each partition on a cluster
            due = self._batch_due(keys=[p + keys.BATCHES_DUE], args=[grace, limit - len(found)])
            found += [str(item) for item in cast("list[Any]", due)]
            if len(found) >= limit:
                break
        return found

    def purge_batches(self, older_than: datetime) -> int:
        """Builds the batches' key names from the partition's prefix in the script (a
        batch tree's keys are all in its partition)."""
        cutoff = older_than.timestamp()
        removed = 0
        for p in self._scopes():
            index = p + keys.BATCHES_ALL
            ids = cast("list[str]", self.client.zrangebyscore(index, "-inf", cutoff))
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                removed += int(self._batch_purge(keys=[index], args=[p, cutoff, *chunk]))
        return removed

    def get_batch(self, batch_id: str, *, members: bool = True) -> b.BatchStatus | None:
        p = self._batch_scope(batch_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(keys.batch(batch_id, p))
        if members:
            pipe.hgetall(keys.batch_members(batch_id, p))
        found = pipe.execute()
        if not found[0]:
            return None
        return _status(found[0], found[1] if members else {})

    def list_batches(self, limit: int = 100) -> list[b.BatchStatus]:
        newest: list[tuple[float, str, str]] = []
        for p in self._scopes():
            for batch_id, created in self.client.zrevrange(
                p + keys.BATCHES_ALL, 0, max(limit - 1, 0), withscores=True
            ):
                newest.append((float(created), str(batch_id), p))
        newest = sorted(newest, reverse=True)[:limit]
        pipe = self.client.pipeline(transaction=False)
        for _, batch_id, p in newest:
            pipe.hgetall(keys.batch(batch_id, p))
        return [_status(found, {}) for found in pipe.execute() if found]


def _moment(value: Any) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if value not in (None, "") else None


def _status(found: dict[str, Any], members: dict[str, Any]) -> b.BatchStatus:
    spec = json.loads(found.get("spec") or "{}")
    return b.BatchStatus(
        id=found["id"], total=int(found["total"]), pending=int(found["pending"]),
        succeeded=int(found["succeeded"]), failed=int(found["failed"]),
        published=found.get("published") == "1", created_at=_moment(found.get("created_at")),
        ended_at=_moment(found.get("ended_at")), moved_at=_moment(found.get("moved_at")),
        parent=found.get("parent") or None,
        callbacks=spec.get("callbacks") or {},
        callback_states={
            which: found.get(which, b.NO_CALLBACK) for which in b.CALLBACKS
            if found.get(which, b.NO_CALLBACK) != b.NO_CALLBACK
        },
        members={name: b.parse_member(value) for name, value in members.items()},
    )  # fmt: skip
