"""The audit trail's Lua function (:data:`AUDIT`), which every Redis store script that
records an event runs, and the compact form a trail keeps its events in (a job's fields
once per job, filled in again by the reader).

Split from :mod:`conventions.store.redis_records`, which registers the scripts and reads
the trails.
"""

from __future__ import annotations

import json
from typing import Any

from conventions.store.records import AuditEvent
from conventions.store.redis_runs import RUN

#: Appends an audit event in the same script as the state change it records, and moves
#: its counters (:mod:`conventions.store.counts`). Every script that uses it takes the audit
#: trail, the by-time index and the counters hash as its last three KEYS and (event JSON
#: or '', the same without its job fields or '', trail ttl s, score, correlation id,
#: counter fields JSON [field, n, ...], trail key prefix, max events per trail, max
#: trails, and the event's run change or '': :data:`~conventions.store.redis_runs.RUN`)
#: as its last ten ARGV.
#:
#: The job fields (task, causation, idempotency key) are kept once per job and trail: an
#: event whose nearest earlier event of the same task id (among the last 16) carries the
#: same ones is kept without them, and the reader fills them in. The two caps bound the
#: trail's size (0: no cap). A trail longer than max events keeps its newest ones (the
#: first event that leaned on a dropped one gets its job fields back); beyond max trails,
#: the trails idle longest are dropped, at most two per event that starts a trail (a
#: lowered cap is reached gradually, as new trails come, and one event never runs long;
#: an event of a trail already indexed cannot grow the index, so it reads no count).
AUDIT = (
    RUN
    + """
local function same_job(raw, task_id)
  if not string.find(raw, task_id, 1, true) then return nil end
  local ok, other = pcall(cjson.decode, raw)
  if ok and type(other) == 'table' and other.j == task_id then return other end
  return nil
end

-- Compared as text, nothing decoded: the full form is '{' .. job fields .. ',' .. the
-- short form after its '{' (redis_audit._compact), which begins with '"j":<id>,"e":' (a
-- ',"' is never inside a JSON string, so the first ',"e":' ends the id). An earlier
-- event that begins with the same job fields and id is this job's with the same fields:
-- short; one of this job with other fields (it begins with '"t":' and holds the id
-- right after its fields): full; any other (another job's, one without job fields, one
-- written in another order by an older release) is passed over. An order not met, or
-- fields another writer escaped otherwise, answers full: a few bytes, never a wrong read.
local function shortest(trail, full, short)
  if short == '' then return full end
  local job = string.match(short, '^{("j":.-,"e":)')
  if job == nil then return full end
  local same = string.sub(full, 1, #full - #short + 1) .. job
  local recent = redis.call('LRANGE', trail, -16, -1)
  for i = #recent, 1, -1 do
    local raw = recent[i]
    if string.sub(raw, 1, #same) == same then return short end
    if string.sub(raw, 1, 5) == '{"t":' and string.find(raw, ',' .. job, 1, true) then
      return full
    end
  end
  return full
end

local function job_fields(carrier)
  local fields = '"t":' .. cjson.encode(carrier.t)
  if carrier.c ~= nil then fields = fields .. ',"c":' .. cjson.encode(carrier.c) end
  if carrier.k ~= nil then fields = fields .. ',"k":' .. cjson.encode(carrier.k) end
  return fields
end

local function trim(trail, max_events, length)
  local drop = length - max_events
  local window = redis.call('LRANGE', trail, 0, drop + 15)
  for i = 1, drop do
    local ok, carrier = pcall(cjson.decode, window[i])
    if ok and type(carrier) == 'table' and carrier.j ~= nil and carrier.t ~= nil then
      for m = drop + 1, #window do
        local other = same_job(window[m], carrier.j)
        if other then
          if other.t == nil then
            local raw = '{' .. job_fields(carrier) .. ',' .. string.sub(window[m], 2)
            redis.call('LSET', trail, m - 1, raw)
          end
          break
        end
      end
    end
  end
  redis.call('LTRIM', trail, -max_events, -1)
end

local function record_audit()
  local n = #ARGV - 1
  local event = ARGV[n - 8]
  if event == '' then return end
  record_run(ARGV[#ARGV])
  local trail, by_time, id = KEYS[#KEYS - 2], KEYS[#KEYS - 1], ARGV[n - 4]
  local length = redis.call('RPUSH', trail, shortest(trail, event, ARGV[n - 7]))
  local max_events = tonumber(ARGV[n - 1])
  if max_events > 0 and length > max_events then
    trim(trail, max_events, length)
  end
  redis.call('EXPIRE', trail, ARGV[n - 6])
  -- only a new trail can take the index past its cap (ZADD answers how many it added)
  local added = redis.call('ZADD', by_time, 'GT', ARGV[n - 5], id)
  local max_trails = tonumber(ARGV[n])
  if max_trails > 0 and added > 0 then
    for _ = 1, 2 do
      if redis.call('ZCARD', by_time) <= max_trails then break end
      local oldest = redis.call('ZPOPMIN', by_time)
      if oldest[1] == id then
        redis.call('ZADD', by_time, oldest[2], id)
        break
      end
      redis.call('DEL', ARGV[n - 2] .. oldest[1])
    end
  end
  local counts = cjson.decode(ARGV[n - 3])
  for i = 1, #counts, 2 do
    redis.call('HINCRBY', KEYS[#KEYS], counts[i], counts[i + 1])
  end
end
"""
)

#: the fields an event shares with the other events of its job (see :data:`AUDIT`)
JOB_FIELDS = ("t", "c", "k")


def _compact(event: AuditEvent) -> tuple[str, str]:
    """The JSON a trail keeps for ``event`` (the compact form, no spaces), and the same
    without its job fields. In that order: the job fields, then ``j`` and ``e``, then the
    rest, so that the full form is ``{`` + the job fields + ``,`` + the short form after
    its ``{``, which :data:`AUDIT` compares as text."""
    data = event.to_compact()
    job = {name: data[name] for name in JOB_FIELDS if name in data}
    short = {"j": data["j"], "e": data["e"]}
    short.update((name, value) for name, value in data.items() if name not in job)
    return _json({**job, **short}), _json(short)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


def _events(found: list[str], correlation_id: str) -> list[AuditEvent]:
    """A trail's events, each without its job fields given those of the nearest earlier
    event of its job that carries them (list order is write order)."""
    carried: dict[str, dict[str, Any]] = {}
    events = []
    for raw in found:
        data = json.loads(raw)
        job = data.get("j")
        if job is not None and "t" in data:
            carried[job] = {name: data[name] for name in JOB_FIELDS if name in data}
        elif job is not None:
            data = {**carried.get(job, {"t": ""}), **data}
        events.append(AuditEvent.from_compact(data, correlation_id))
    return events
