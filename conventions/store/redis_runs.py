"""The run history part of the Redis store (:mod:`conventions.store.runs`).

A run record is a string ``{prefix}run:rec:<task id>`` (its JSON), indexed by creation
time in sorted sets: every run (``run:all``), and by task, state (but
:data:`UNINDEXED_STATES`) and queue (``run:ix:<field>:<value>``; an index empties, and
so goes, with its last run); by key
and by correlation id in two lexicographic sets (``run:lex:key``, ``run:lex:correlation_id``,
members ``<value>\\0<task id>``), so that a run of its own key or correlation costs an
entry, not a key. A record's index entries follow from its fields: nothing else is kept.

Each record is written by :data:`RUN`, a Lua function the audit script calls with the
change its event carries (the audit script's last ARGV, '' for none): no round trip of
its own. The size is bounded: a record holds at most ``MAX_ATTEMPTS`` attempts and
``runs_max_logs`` lines, and beyond ``runs_max`` runs the oldest are dropped (at most
two per new run: an update cannot grow the index, so it reads no count), so no record
needs a TTL; retention purges by age
(:meth:`RedisRuns.purge_runs`). About :data:`RUN_BYTES` per run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import cast

import redis

from conventions.store import keys, runs
from conventions.store.records import AuditEvent
from conventions.store.runs import Run

#: one run in Redis, its index entries included (about 1,090 bytes measured by ``INFO
#: memory`` over 2,000 jobs of three events each, no log lines), for sizing
RUN_BYTES = 1100
#: the states without an index of their own (most runs are in them, and briefly queued):
#: a filter on one reads the time index (or another filter's), checking the state
UNINDEXED_STATES = frozenset({"queued", "succeeded"})
#: the most index entries one ``list_runs`` call reads through (its filters on top of
#: the index it reads): a bound on the time Redis spends in it
MAX_SCAN = 5000


def _lua_rules() -> str:
    """The order of a run's states, in Lua, from the one Python source
    (:data:`conventions.store.runs.RANK` and ``FINAL_RANK``); the patch itself says
    which fields move with the state (``move``)."""
    ranks = ", ".join(f"{state} = {rank}" for state, rank in runs.RANK.items())
    return f"""
local RUN_RANK = {{{ranks}}}
local RUN_FINAL = {runs.FINAL_RANK}
"""


#: Lua: ``record_run(raw)`` applies a run change (JSON: the patch of
#: :func:`conventions.store.runs.patch` plus ``pre``, ``max``, ``max_logs`` and
#: ``max_attempts``); the same rules as :func:`conventions.store.runs.merge` (the order
#: table generated from :mod:`conventions.store.runs`; a test checks the two agree).
RUN = (
    _lua_rules()
    + """
local function run_list(value)
  if type(value) == 'table' and value[1] ~= nil then return value end
  return {}
end

-- runs.order_of and runs.moves: whether a change of this order moves the record's state
local function run_order(doc)
  local held = doc.order
  if type(held) == 'table' and held[1] ~= nil and held[2] ~= nil then return held end
  local rank = RUN_RANK[doc.state]
  if rank == nil then return nil end
  return {rank, 0}
end

local function run_moves(doc, order)
  if type(order) ~= 'table' or order[1] == nil then return false end
  local held = run_order(doc)
  if held == nil then return true end
  if held[1] >= RUN_FINAL then return false end
  if order[1] ~= held[1] then return order[1] > held[1] end
  return order[2] >= held[2]
end

-- a run's index entries, from its record: {index key, score or false (lex), member}
local function run_entries(pre, doc)
  local out = {}
  local created, id = doc.created_at, doc.id
  out[pre .. 'all'] = {pre .. 'all', created, id}
  for _, name in ipairs({'task', 'state', 'queue'}) do
    local value = doc[name]
    if name == 'state' and (value == 'queued' or value == 'succeeded') then value = nil end
    if type(value) == 'string' and value ~= '' then
      local index = pre .. 'ix:' .. name .. ':' .. value
      out[index] = {index, created, id}
    end
  end
  for _, name in ipairs({'key', 'correlation_id'}) do
    local value = doc[name]
    if type(value) == 'string' and value ~= '' then
      local member = value .. '\\0' .. id
      out[pre .. 'lex:' .. name .. '|' .. member] = {pre .. 'lex:' .. name, false, member}
    end
  end
  return out
end

local function unindex(entry)
  redis.call('ZREM', entry[1], entry[3])
end

-- the one index entry of field `name` ('all' or one of run_entries' fields) of a record
-- (or of the values a record had: `view`), as run_entries makes it, or nil
local RUN_INDEXED = {'all', 'task', 'state', 'queue', 'key', 'correlation_id'}
local function run_entry(pre, name, view)
  if name == 'all' then return {pre .. 'all', view.created_at, view.id} end
  local value = view[name]
  if name == 'state' and (value == 'queued' or value == 'succeeded') then return nil end
  if type(value) ~= 'string' or value == '' then return nil end
  if name == 'key' or name == 'correlation_id' then
    return {pre .. 'lex:' .. name, false, value .. '\\0' .. view.id}
  end
  return {pre .. 'ix:' .. name .. ':' .. value, view.created_at, view.id}
end

-- what run_entries(pre, had) against run_entries(pre, doc) writes, field by field, and
-- only for the fields whose value moved (an update moves its state, seldom more): an
-- entry wanted and not had is added, a scored one again when created_at moved, one
-- had and not wanted removed
local function reindex(pre, had, doc)
  local moved_time = had.created_at ~= doc.created_at
  for _, name in ipairs(RUN_INDEXED) do
    if moved_time or had.id ~= doc.id or (name ~= 'all' and had[name] ~= doc[name]) then
      local old, new = run_entry(pre, name, had), run_entry(pre, name, doc)
      -- the same entry as run_entries names them: a scored one by its index, a lex one
      -- by its member too
      local lex = name == 'key' or name == 'correlation_id'
      local same = old and new and old[1] == new[1] and (not lex or old[3] == new[3])
      if new and (not same or (new[2] and moved_time)) then
        redis.call('ZADD', new[1], new[2] or 0, new[3])
      end
      if old and not same then unindex(old) end
    end
  end
end

local function drop_run(pre, id)
  local key = pre .. 'rec:' .. id
  local raw = redis.call('GET', key)
  redis.call('ZREM', pre .. 'all', id)
  if not raw then return 0 end
  for _, entry in pairs(run_entries(pre, cjson.decode(raw))) do unindex(entry) end
  return redis.call('DEL', key)
end

local function record_run(raw)
  if raw == nil or raw == '' then return end
  local p = cjson.decode(raw)
  local key = p.pre .. 'rec:' .. p.id
  local found = redis.call('GET', key)
  local doc = {id = p.id}
  local had = nil  -- the indexed values the record had
  if found then
    doc = cjson.decode(found)
    had = {id = doc.id, created_at = doc.created_at}
    for _, name in ipairs(RUN_INDEXED) do had[name] = doc[name] end
  end
  if run_moves(doc, p.order) then
    for k, v in pairs(p.move or {}) do doc[k] = v end
    doc.order = p.order
  end
  for k, v in pairs(p.set) do doc[k] = v end
  for k, v in pairs(p.once) do
    if doc[k] == nil or doc[k] == '' or doc[k] == cjson.null then doc[k] = v end
  end
  for k, v in pairs(p.earliest or {}) do
    if type(doc[k]) ~= 'number' or v < doc[k] then doc[k] = v end
  end
  for k, v in pairs(p.latest or {}) do
    if type(doc[k]) ~= 'number' or v > doc[k] then doc[k] = v end
  end
  local attempts = run_list(doc.attempts)
  if p.attempt then
    local step = nil
    for i = #attempts, 1, -1 do
      if attempts[i].n == p.attempt.n then step = attempts[i] break end
    end
    if step then
      for k, v in pairs(p.attempt) do step[k] = v end
    else  -- in attempt order, whatever order the events came in
      local at = #attempts + 1
      for i = 1, #attempts do
        if (attempts[i].n or 0) > p.attempt.n then at = i break end
      end
      table.insert(attempts, at, p.attempt)
    end
    while #attempts > p.max_attempts do table.remove(attempts, 2) end
  end
  doc.attempts = attempts
  local lines = run_list(doc.logs)
  if p.logs then
    for _, line in ipairs(p.logs) do lines[#lines + 1] = line end
  end
  while #lines > p.max_logs do table.remove(lines, 1) end
  doc.logs = lines
  if had then
    reindex(p.pre, had, doc)
  else
    for _, entry in pairs(run_entries(p.pre, doc)) do
      redis.call('ZADD', entry[1], entry[2] or 0, entry[3])
    end
  end
  redis.call('SET', key, cjson.encode(doc))
  if p.max > 0 and had == nil then  -- only a new record takes the index past its cap
    for _ = 1, 2 do
      if redis.call('ZCARD', p.pre .. 'all') <= p.max then break end
      local oldest = redis.call('ZRANGE', p.pre .. 'all', 0, 0)
      if oldest[1] == p.id then break end
      drop_run(p.pre, oldest[1])
    end
  end
end
"""
)

#: KEYS: index. ARGV: record key prefix, min score, max score, limit, filters JSON, scan
#: bound, lex prefix ('' for a sorted set by time). Newest first: the records passing
#: every filter (a lex index, by key or correlation id, is read whole up to the bound and
#: sorted by time here).
_LIST_RUNS = """
local filters = cjson.decode(ARGV[5])
local limit, bound = tonumber(ARGV[4]), tonumber(ARGV[6])
local low, high = tonumber(ARGV[2]) or -math.huge, tonumber(ARGV[3]) or math.huge
if ARGV[2] == '-inf' then low = -math.huge end
if ARGV[3] == '+inf' then high = math.huge end
local function passes(doc)
  for k, v in pairs(filters) do
    if doc[k] ~= v then return false end
  end
  return doc.created_at >= low and doc.created_at <= high
end
local out = {}
if ARGV[7] ~= '' then
  local members = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. ARGV[7], '[' .. ARGV[7] .. '\\255',
                             'LIMIT', 0, bound)
  local found = {}
  for _, member in ipairs(members) do
    local id = string.sub(member, #ARGV[7] + 1)
    local data = redis.call('GET', ARGV[1] .. id)
    if data then
      local doc = cjson.decode(data)
      if passes(doc) then found[#found + 1] = {doc.created_at, id, data} end
    end
  end
  table.sort(found, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] > b[2]
  end)
  for i = 1, math.min(limit, #found) do out[i] = found[i][3] end
  return out
end
local offset = 0
while #out < limit and offset < bound do
  local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[3], ARGV[2], 'LIMIT', offset, 200)
  if #ids == 0 then break end
  offset = offset + #ids
  for _, id in ipairs(ids) do
    local data = redis.call('GET', ARGV[1] .. id)
    if data then
      if next(filters) == nil or passes(cjson.decode(data)) then
        out[#out + 1] = data
        if #out >= limit then break end
      end
    end
  end
end
return out
"""

#: KEYS: the time index (``run:all``). ARGV: run prefix, max score (exclusive form),
#: batch. Returns {seen, dropped}.
_PURGE_RUNS = (
    RUN
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local removed = 0
for _, id in ipairs(ids) do removed = removed + drop_run(ARGV[1], id) end
return {#ids, removed}
"""
)


def _score(moment: datetime | None, default: str) -> str:
    if moment is None:
        return default
    return repr(runs.posix(moment if moment.tzinfo else moment.replace(tzinfo=UTC)))


class RedisRuns(keys.Scoped):
    """Run records: the methods of :class:`~conventions.store.redis.RedisStore` that
    read them (writes ride the audit scripts, :meth:`_run_arg`)."""

    client: redis.Redis
    #: record run history at all
    runs_enabled: bool
    #: the most runs kept (0: no cap), and log lines per run
    runs_max: int
    runs_max_logs: int

    def _register_runs(self) -> None:
        register = self.client.register_script
        self._list_runs = register(_LIST_RUNS)
        self._purge_runs = register(_PURGE_RUNS)

    def _run_arg(self, event: AuditEvent | None, scope: str) -> str:
        """The audit scripts' last ARGV: ``event``'s run change for :data:`RUN`, or ''."""
        if event is None or event.run is None or not self.runs_enabled:
            return ""
        return json.dumps(
            {
                **event.run,
                "pre": f"{scope}run:",
                "max": self._share(self.runs_max),
                "max_logs": self.runs_max_logs,
                "max_attempts": runs.MAX_ATTEMPTS,
            },
            separators=(",", ":"),
        )

    def get_run(self, task_id: str) -> Run | None:
        """One ``GET`` on one node; on a cluster the record's partition follows its job's
        key, unknown here: one ``GET`` per partition, pipelined by node."""
        scopes = self._scopes()
        if len(scopes) == 1:
            data = self.client.get(f"{scopes[0]}run:rec:{task_id}")
            return None if data is None else Run.from_doc(json.loads(cast(str, data)))
        pipe = self.client.pipeline(transaction=False)
        for scope in scopes:
            pipe.get(f"{scope}run:rec:{task_id}")
        found = [Run.from_doc(json.loads(data)) for data in pipe.execute() if data]
        return max(found, key=lambda run: run.updated_at, default=None)

    def list_runs(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        **filters: str | None,
    ) -> list[Run]:
        """Newest first (by creation); the most selective filter's index is read, the
        others are checked on the way (at most :data:`MAX_SCAN` entries)."""
        unknown = set(filters) - set(runs.FILTERS)
        if unknown:
            raise TypeError(f"list_runs: unknown filters {sorted(unknown)}")
        given = {name: value for name, value in filters.items() if value is not None}
        if limit <= 0:
            return []
        index, rest, lex = "all", dict(given), ""
        for name in ("key", "correlation_id"):
            if name in rest:
                index, lex = f"lex:{name}", f"{rest.pop(name)}\0"
                break
        else:
            for name in ("task", "queue", "state"):
                if name in rest and rest[name] not in UNINDEXED_STATES:
                    index = f"ix:{name}:{rest.pop(name)}"
                    break
        found: list[Run] = []
        for scope in self._scopes():  # one on one node; each partition on a cluster
            part = self._list_runs(
                keys=[f"{scope}run:{index}"],
                args=[
                    f"{scope}run:rec:", _score(since, "-inf"), _score(until, "+inf"),
                    limit, json.dumps(rest) if rest else "{}", MAX_SCAN, lex,
                ],
            )  # fmt: skip
            found += [Run.from_doc(json.loads(data)) for data in cast("list[str]", part)]
        if not self.clustered:
            return found
        found.sort(key=lambda run: (run.created_at, run.id), reverse=True)
        return found[:limit]

    def count_runs(self) -> int:
        return sum(int(n) for n in self._each("ZCARD", [f"{p}run:all" for p in self._scopes()]))

    def purge_runs(self, older_than: datetime) -> int:
        """Drops the runs created before ``older_than``, in batches; counts them."""
        removed = 0
        for scope in self._scopes():
            while True:
                seen, dropped = cast(
                    "list[int]",
                    self._purge_runs(
                        keys=[f"{scope}run:all"],
                        args=[f"{scope}run:", f"({_score(older_than, '')}", 500],
                    ),
                )
                removed += int(dropped)
                if int(seen) < 500:
                    break
        return removed
