"""The fetch's scripts and what its replies can say (:mod:`conventions.transport.redis`).

A fetch moves an entry from a queue's list into the consumer's inbox (``BLMOVE``, or
:data:`SWEEP` over several lists), then :data:`CLAIM` moves it into kombu's unacked set;
an entry whose ``eta`` is still ahead (pushed by a producer beside the transport) is put
in its delayed set instead (:data:`DEFER`): a consumer never holds one.
"""

from __future__ import annotations

from redis.exceptions import ResponseError

#: a message due within this many seconds is delivered, not sent back to wait
EARLY = 1.0

#: KEYS: sources..., inboxes... -> {index, entry} from the first non-empty source, or nil
SWEEP = """
local n = #KEYS / 2
for i = 1, n do
  local entry = redis.call('LMOVE', KEYS[i], KEYS[n + i], 'RIGHT', 'LEFT')
  if entry then return {i, entry} end
end
return false
"""
#: KEYS: inbox, unacked index, unacked; ARGV: entry, tag, now, record, "1" to record it
#: as unacked ("0": a no-ack consumer's, nothing will ack it) -> 1 claimed, 0 gone
CLAIM = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
end
return 1
"""
#: CLAIM for an entry over the size cap, named by its size and sha1 rather than sent
#: back whole; ARGV: size, sha1, tag, now, record, "1" to record it -> 1 claimed, 0 gone
CLAIM_LARGE = """
local size = tonumber(ARGV[1])
for i = 0, redis.call('LLEN', KEYS[1]) - 1 do
  local entry = redis.call('LINDEX', KEYS[1], i)
  if entry and #entry == size and redis.sha1hex(entry) == ARGV[2] then
    redis.call('LREM', KEYS[1], 1, entry)
    if ARGV[6] == '1' then
      redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
      redis.call('HSET', KEYS[3], ARGV[3], ARGV[5])
    end
    return 1
  end
end
return 0
"""
#: KEYS: inbox, delayed set; ARGV: entry, due, member -> 1 deferred, 0 gone: a message
#: pushed with a future eta by another producer waits in the delayed set, not in memory
DEFER = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""


def refuses_client_reply(exc: ResponseError) -> bool:
    """Whether an error reply says the broker's user may not run ``CLIENT REPLY``."""
    text = str(exc).lower()
    return "client|reply" in text or ("client" in text and "reply" in text and "noperm" in text)
