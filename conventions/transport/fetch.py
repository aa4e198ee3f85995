"""The fetch's scripts and what its replies can say (:mod:`conventions.transport.redis`).

A fetch moves an entry from a queue's list into the consumer's inbox (``BLMOVE``, or
:data:`SWEEP` over several lists), then :data:`CLAIM` moves it into kombu's unacked set,
scored with the Redis server's clock (``TIME``), never the worker's: kombu's restore
compares that score with the same clock.

A consumer of several lists that found them all empty waits on their queues' bells
(``BLPOP``, :data:`~conventions.transport.layout.BELL`), which every publish of the
layer rings in the same script as its push (:data:`PUSH_RING`, and the one-trip
publish's script): the token only wakes it, the sweep that follows moves the message,
so a consumer killed between the two loses a token, never a message.

An entry whose ``eta`` is still ahead *on the Redis clock* (pushed by a producer beside
the transport, or published straight by a publisher whose clock runs ahead) goes to its
delayed set instead, in the same script: a consumer never holds one, and the claimed
message is delivered without its ``eta`` (:func:`conventions.transport.delayed.undelayed`),
so the worker's own clock, fast or slow, never holds it back nor lets it run early.
"""

from __future__ import annotations

from redis.exceptions import ResponseError

from conventions.transport.layout import BELL_TTL, TURN_SLACK

#: KEYS: sources..., inboxes..., bells...; ARGV: number of sources -> {index, entry}
#: from the first non-empty source, or nil, when the bells of these (all empty) lists
#: are deleted: every token in them announced a message already taken
SWEEP = """
local n = tonumber(ARGV[1])
for i = 1, n do
  local entry = redis.call('LMOVE', KEYS[i], KEYS[n + i], 'RIGHT', 'LEFT')
  if entry then return {i, entry} end
end
for i = 2 * n + 1, #KEYS do redis.call('DEL', KEYS[i]) end
return false
"""
#: kombu's ``LPUSH`` and the ring of the queue's bell, capped and expiring, in one
#: command. KEYS: list, bell; ARGV: message, cap, ttl seconds
PUSH_RING = """
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], '1')
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""
#: KEYS: inbox, unacked index, unacked, delayed set, its queue's turn and mover bell;
#: ARGV: entry, tag, record, "1" to record it as unacked ("0": a no-ack consumer's,
#: nothing will ack it), due ("" none), delayed member, seconds added to the Redis clock
#: for the due time (tests) -> 1 claimed, 2 deferred (not yet due on the Redis clock: it
#: waits in the delayed set, and the turn's holder is woken as by
#: :data:`conventions.transport.delayed.PUSH`), 0 gone
CLAIM = (
    f"""
local slack = {round(TURN_SLACK * 1000)}
local bell_ttl = {BELL_TTL}
"""
    + """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if ARGV[5] ~= '' and tonumber(ARGV[5]) > now + tonumber(ARGV[7]) then
  redis.call('ZADD', KEYS[4], ARGV[5], ARGV[6])
  local by = math.max(0, math.floor((tonumber(ARGV[5]) - now) * 1000)) + slack
  if redis.call('PTTL', KEYS[5]) > by then redis.call('PEXPIRE', KEYS[5], by) end
  redis.call('LPUSH', KEYS[6], '1')
  redis.call('LTRIM', KEYS[6], 0, 0)
  redis.call('EXPIRE', KEYS[6], bell_ttl)
  return 2
end
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[2], string.format('%.6f', now), ARGV[2])
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
end
return 1
"""
)
#: CLAIM for an entry over the size cap (dead-lettered at once, never deferred), named by
#: its size and sha1 rather than sent back whole; KEYS as CLAIM's; ARGV: size, sha1, tag,
#: record, "1" to record it -> 1 claimed, 0 gone
CLAIM_LARGE = """
local size = tonumber(ARGV[1])
for i = 0, redis.call('LLEN', KEYS[1]) - 1 do
  local entry = redis.call('LINDEX', KEYS[1], i)
  if entry and #entry == size and redis.sha1hex(entry) == ARGV[2] then
    redis.call('LREM', KEYS[1], 1, entry)
    if ARGV[5] == '1' then
      local t = redis.call('TIME')
      local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
      redis.call('ZADD', KEYS[2], string.format('%.6f', now), ARGV[3])
      redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
    end
    return 1
  end
end
return 0
"""
#: what :data:`CLAIM` answers
GONE, CLAIMED, DEFERRED = 0, 1, 2


def refuses_client_reply(exc: ResponseError) -> bool:
    """Whether an error reply says the broker's user may not run ``CLIENT REPLY``."""
    text = str(exc).lower()
    return "client|reply" in text or ("client" in text and "reply" in text and "noperm" in text)
