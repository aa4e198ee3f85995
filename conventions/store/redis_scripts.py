"""The Lua scripts of the Redis store's enqueue dedup and execution ledger.

Each is one atomic step, registered once by :class:`~conventions.store.redis.RedisStore`
and run by ``EVALSHA``. A script that records an audit event ends its KEYS and ARGV with
the audit parts (``RedisRecords._audit_parts``), which ``record_audit()`` reads from the
end, so the leading KEYS and ARGV are the script's own (documented above each one).
Key names are in :mod:`conventions.store.keys`.
"""

from __future__ import annotations

from conventions.store.redis_audit import AUDIT
from conventions.store.redis_done import LUA as DONE

#: Defines ``take_reservation(print_key, fingerprint)``: the dedup key KEYS[1] for job
#: ARGV[1] (ttl ms ARGV[2], or '' for none), its payload fingerprint in ``print_key``
#: (same ttl). Returns {the other job holding it, its fingerprint or ''}, or false when
#: it is this job's (taken now, with the audit event recorded, or already).
_TAKE_RESERVATION = """
local function take_reservation(print_key, fingerprint)
  -- one command takes the key or reads its holder (SET NX GET, Redis 7.0)
  local holder
  if ARGV[2] == '' then
    holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET')
  else
    holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'PX', ARGV[2])
  end
  if holder then
    if holder == ARGV[1] then return false end
    return {holder, redis.call('GET', print_key) or ''}
  end
  if fingerprint == '' then
    redis.call('DEL', print_key)
  elseif ARGV[2] == '' then
    redis.call('SET', print_key, fingerprint)
  else
    redis.call('SET', print_key, fingerprint, 'PX', ARGV[2])
  end
  record_audit()
  return false
end
"""

#: KEYS: dedup, print, audit keys. ARGV: job id, ttl ms or '', fingerprint or '', audit
#: args. Returns {holder, its fingerprint}, or false when the reservation is ours (the
#: audit event is recorded only when this call made the reservation).
RESERVE = AUDIT + _TAKE_RESERVATION + "return take_reservation(KEYS[2], ARGV[3])\n"

#: KEYS: dedup, print. ARGV: job id. Drops the reservation and its fingerprint when the
#: job still holds it.
UNRESERVE_ONE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1], KEYS[2]) end
return 0
"""

#: The publish in one round trip (:mod:`conventions.transport.publish`), run on the broker's
#: connection: in the store's database, the reservation (when ARGV[3] is '1') and the
#: audit event; then, in the broker's, kombu's ``LPUSH`` of the message (``SELECT`` only
#: when the two databases differ, so a server that refuses it works with one database).
#: With a bell cap above 0 it also rings the queue's bell (a token, the bell capped and
#: expiring), which wakes an idle consumer of several queues
#: (:mod:`conventions.transport.layout`), and publishes the fanout messages it is given
#: (the job's ``task-sent`` event: :mod:`conventions.transport.hook`). KEYS: dedup, the
#: queue's list, print, bell, audit keys. ARGV: job id, ttl ms or '', reserve ('1' or
#: '0'), store db, broker db, message, fingerprint or '', bell cap ('0': no ring), bell
#: ttl s, how many publishes, each its channel and payload, audit args. Returns {holder,
#: its fingerprint} (nothing pushed, nothing published) or false.
RESERVE_PUSH = (
    AUDIT
    + _TAKE_RESERVATION
    + """
local other_db = ARGV[4] ~= ARGV[5]
if other_db then redis.call('SELECT', ARGV[4]) end
local holder = false
if ARGV[3] == '1' then holder = take_reservation(KEYS[3], ARGV[7]) else record_audit() end
if other_db then redis.call('SELECT', ARGV[5]) end
if holder then return holder end
redis.call('LPUSH', KEYS[2], ARGV[6])
local cap = tonumber(ARGV[8])
if cap > 0 then
  redis.call('LPUSH', KEYS[4], '1')
  redis.call('LTRIM', KEYS[4], 0, cap - 1)
  redis.call('EXPIRE', KEYS[4], ARGV[9])
end
for i = 11, 10 + 2 * tonumber(ARGV[10]), 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
return false
"""
)

#: KEYS: ledger, deliveries, the done buckets, audit keys. ARGV: owner, lease ms,
#: delivery ttl ms, how many done buckets, the key's digest, audit args. Returns
#: {status, holder, outcome, deliveries, fingerprint}; the audit event is recorded only
#: on a claim. A done entry of the layout before the buckets (``state=done`` in the
#: ledger hash) still answers done.
CLAIM = (
    AUDIT
    + DONE
    + """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner', 'outcome', 'print')
if entry[1] == 'done' then
  return {'done', entry[2], entry[3], 0, entry[4]}
end
local done = find_done(3, tonumber(ARGV[4]), ARGV[5], server_ms())  -- farthest first
if done then
  return {'done', done[1], done[3], 0, done[2]}
end
if entry[1] == 'running' then
  return {'held', entry[2], false, 0}
end
if entry[1] then redis.call('DEL', KEYS[1]) end  -- another state's fields: not kept
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local count = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
record_audit()
return {'claimed', ARGV[1], false, count}
"""
)

#: KEYS: ledger. ARGV: owner, lease ms. Returns 1 when the lease was ours and extended.
RENEW = """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner')
if entry[1] == 'running' and entry[2] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

#: Drops the enqueue reservation KEYS[2] (and its fingerprint KEYS[3]) when ARGV[4] is
#: '1' and it holds ARGV[5].
_UNRESERVE = """
if ARGV[4] == '1' and redis.call('GET', KEYS[2]) == ARGV[5] then
  redis.call('DEL', KEYS[2], KEYS[3])
end
"""

#: KEYS: ledger, dedup, print, deliveries (or the ledger again: none), the done buckets,
#: audit keys. ARGV: owner, outcome, keep ms, has reservation, reserved_by, fingerprint
#: (short form) or '', how many done buckets, the key's digest, audit args. Records done
#: in its day bucket (:mod:`conventions.store.redis_done`) when the lease is still ours
#: or the entry vanished (our lease expired but the body finished: the result stands),
#: and drops the delivery counter (a done key is never claimed again: it counts nothing
#: more); the audit event is recorded either way, except on a replay (done already, by
#: this owner: a retried write whose first reply was lost). Returns 1 when done was
#: recorded.
COMPLETE = (
    AUDIT
    + DONE
    + """
local entry = redis.call('HMGET', KEYS[1], 'state', 'owner')
if entry[1] == 'done' and entry[2] == ARGV[1] then return 0 end  -- a replay: done already
local now_ms = server_ms()
local buckets = tonumber(ARGV[7])
-- only the bucket this completion writes to: a replay (or another run's done of the
-- same keep) is there; one lookup instead of one per bucket
local target = done_bucket(5, buckets, now_ms + tonumber(ARGV[3]))
local done = find_done(target, 1, ARGV[8], now_ms)
if done and done[1] == string.sub(ARGV[1], 1, OWNER_CHARS) then return 0 end  -- a replay
local recorded = 0
local drop = {}  -- the ledger entry (when done is recorded) and the delivery counter
if not done and (entry[1] == false or (entry[1] == 'running' and entry[2] == ARGV[1])) then
  if entry[1] then drop[1] = KEYS[1] end
  write_done(5, buckets, ARGV[8], now_ms, tonumber(ARGV[3]), ARGV[1], ARGV[6], ARGV[2])
  recorded = 1
end
if KEYS[4] ~= KEYS[1] then drop[#drop + 1] = KEYS[4] end
if #drop > 0 then redis.call('DEL', unpack(drop)) end  -- one command for both
"""
    + _UNRESERVE
    + "record_audit()\nreturn recorded\n"
)

#: KEYS: ledger, dedup, print. ARGV: owner, (unused), (unused), has reservation,
#: reserved_by.
RELEASE = (
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


#: Defines ``key_state()``: {holder, its pttl, state, owner, outcome, the entry's pttl} of
#: the key whose dedup, ledger and print are KEYS[1..3], its done buckets KEYS[4..], ARGV:
#: how many done buckets, the key's digest. A done entry of either layout answers.
_KEY_STATE = (
    DONE
    + """
local function key_state()
  local holder = redis.call('GET', KEYS[1])
  local reserved_ms = redis.call('PTTL', KEYS[1])
  local entry = redis.call('HMGET', KEYS[2], 'state', 'owner', 'outcome')
  local entry_ms = redis.call('PTTL', KEYS[2])
  if entry[1] ~= 'done' then
    local done = find_done(4, tonumber(ARGV[1]), ARGV[2], server_ms())
    if done then return {holder, reserved_ms, 'done', done[1], done[3], done[4]} end
  end
  return {holder, reserved_ms, entry[1], entry[2], entry[3], entry_ms}
end
"""
)

#: KEYS: dedup, ledger, print, the done buckets, audit keys. ARGV: how many done buckets,
#: the key's digest, audit args. Drops them all (the key's field of every bucket),
#: records the audit event; returns ``key_state()`` as it was.
CLEAR_KEY = (
    AUDIT
    + _KEY_STATE
    + """
local found = key_state()
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
for i = 4, 3 + tonumber(ARGV[1]) do redis.call('HDEL', KEYS[i], ARGV[2]) end
record_audit()
return found
"""
)
