"""Celery result writes that ride with a ledger step of the Redis store.

With ``task_track_started``, Celery writes a job's STARTED state before its body and its
SUCCESS after; the layer claims the key before the body and completes it after. On one
Redis server those are four round trips where two do: :mod:`conventions.results.redis` hands
the store Celery's write, and the store sends it in the same script as the claim or the
completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def with_result(script: str) -> str:
    """``script`` followed by a Celery result write, in one script
    (:mod:`conventions.results.redis`): the ledger step and the result's ``SET`` and
    ``PUBLISH`` (what Celery's Redis backend sends) in one round trip. As Celery's
    backend does (with a ``GET`` before each write), a stored SUCCESS is never
    overwritten; here a write with an expiry reads what it replaced (``SET ... GET``) and
    puts a SUCCESS back in the same script, so the rule costs no command of its own (a
    SUCCESS put back gets the write's expiry: the result's full lifetime from then); a
    write without an expiry reads first.

    Runs on the store's connection. KEYS[1] is the result key; ARGV[1..4] are the result,
    its ttl in seconds ('' for none), the store's database and the results' (``SELECT``
    only when they differ; Redis 7 keeps it inside the script). ``script`` sees KEYS and
    ARGV without them, and its answer is returned.
    """
    return (
        """
local result_key = table.remove(KEYS, 1)
local result = table.remove(ARGV, 1)
local result_ttl = table.remove(ARGV, 1)
local store_db = table.remove(ARGV, 1)
local results_db = table.remove(ARGV, 1)
local answer = (function()
"""
        + script
        + """
end)()
if results_db ~= store_db then redis.call('SELECT', results_db) end
-- Celery's rule, kept here instead of a read before the write: a SUCCESS is never
-- overwritten (a late STARTED of a redelivered copy, say). A write with an expiry (the
-- usual one) answers what it replaced (SET GET: one command, where a GET first was two)
-- and puts a SUCCESS it replaced back at once, inside this script, so no reader ever
-- sees the other value; one without reads first (a SUCCESS put back would lose its own)
local current
local wrote = result_ttl ~= ''
if wrote then
  current = redis.call('SET', result_key, result, 'EX', result_ttl, 'GET')
else
  current = redis.call('GET', result_key)
end
local readable, meta = false, nil
-- a value without the word SUCCESS is no SUCCESS: decoded only when it may be one
if current and string.find(current, 'SUCCESS', 1, true) then
  readable, meta = pcall(cjson.decode, current)
end
if readable and type(meta) == 'table' and meta['status'] == 'SUCCESS' then
  if wrote then redis.call('SET', result_key, current, 'EX', result_ttl) end
else
  if not wrote then redis.call('SET', result_key, result) end
  redis.call('PUBLISH', result_key, result)
end
if results_db ~= store_db then redis.call('SELECT', store_db) end
return answer
"""
    )


@dataclass(frozen=True)
class ResultWrite:
    """A Celery result write that rides with a ledger step
    (:mod:`conventions.results.redis`)."""

    key: str
    value: str | bytes
    #: seconds, or None to keep it
    ttl: int | None
    #: the result backend's database, on the store's server
    database: int

    def parts(self, store_db: int) -> tuple[list[str], list[Any]]:
        """The leading KEYS and ARGV of a script made by :func:`with_result`."""
        ttl = "" if not self.ttl else self.ttl
        return [self.key], [self.value, ttl, store_db, self.database]
