"""The Redis store's done entries: a compact fingerprint and state per key, in day buckets.

A finished job's ledger entry is what the store keeps longest (``ledger_keep``, 7 days by
default), so it is what a fleet's Redis holds most of: at 100 jobs/s, 60 million entries a
week. The running lease stays the ``{p}ledger:{key}`` hash it was (short-lived, dropped
at completion); "done" goes into a hash per day of expiry, ``{p}done:{day}``:

* the field is a 12-byte BLAKE2b digest of the namespaced key (never its text: an
  operator's ``keys show KEY`` names the key, and the digest finds it);
* the value is ``<expiry><owner>|<fingerprint>[|<outcome>]``: the expiry in 10 ms steps
  after the bucket's day began (5 base-36 digits), the first :data:`OWNER_CHARS` of the
  completing run's owner, the payload fingerprint in short form (:func:`short_print`),
  and the outcome only when it is not ``succeeded``. 28 characters for a job with a
  fingerprint, about 90 bytes of Redis memory per entry;
* a bucket expires at the end of its day (``PEXPIREAT``), so the entries of a day go in
  one step, and each entry's own expiry is checked by its readers: a key is done for
  exactly ``keep``.

The readers (claim, completion, ``keys show``/``clear``) look in the buckets of today and
the next ``ceil(horizon / 1 day) + 1`` days, declared as the scripts' KEYS (so on Redis
Cluster they are in the job's partition like its other keys). ``horizon`` is the store's
``done_horizon`` (the setting ``conventions_ledger_keep_seconds``): a ``keep`` beyond it is
cut to it. Entries written by a release before this one (``state=done`` in the
``ledger:`` hash) are still read until they expire; new ones are written in the buckets.
"""

from __future__ import annotations

import base64
import hashlib
import math
import time
from typing import Any, Final

#: the span of one done bucket, seconds
BUCKET_SECONDS: Final = 86400
#: how many characters of the completing run's owner a done entry keeps (the runner's
#: owners are random hex: 8 say which run it was well enough for a log line)
OWNER_CHARS: Final = 8
#: the outcome a done entry leaves out (the runner's own)
PLAIN_OUTCOME: Final = "succeeded"


def digest(key: str) -> bytes:
    """The field of ``key`` (namespaced) in its done bucket."""
    return hashlib.blake2b(key.encode(), digest_size=12).digest()


def days(horizon: float, now: float | None = None) -> list[int]:
    """The day numbers of the buckets a reader looks in, the farthest first (where a
    done key of the usual keep is): the last day a ``horizon`` keep can reach, and one,
    down to yesterday (a clock a little ahead of the server's)."""
    today = int((time.time() if now is None else now) // BUCKET_SECONDS)
    ahead = math.ceil(max(horizon, 0) / BUCKET_SECONDS) + 1
    return list(range(today + ahead, today - 2, -1))


def short_print(fingerprint: str | None) -> str:
    """``v1:<16 hex digits>`` as ``v1~<11 base64 characters>`` (what the entry keeps);
    any other form as it is ('' for none)."""
    if not fingerprint:
        return ""
    version, _, hexed = fingerprint.partition(":")
    try:
        raw = bytes.fromhex(hexed) if len(hexed) == 16 else b""
    except ValueError:
        raw = b""
    if not raw:
        return fingerprint
    return f"{version}~{base64.urlsafe_b64encode(raw).decode().rstrip('=')}"


def long_print(printed: str | None) -> str | None:
    """The fingerprint a done entry keeps, back in its usual form (None for none)."""
    if not printed:
        return None
    version, marker, packed = printed.partition("~")
    if not marker:
        return printed
    return f"{version}:{base64.urlsafe_b64decode(packed + '=').hex()}"


def read(
    buckets: list[str], values: list[str | None], now: float | None = None
) -> list[Any] | None:
    """[state, owner, outcome, ms left] of the first live entry among ``values`` (the
    key's field in each of ``buckets``, as ``HGET`` answered), or None: what
    ``find_done`` answers, read on this machine's clock (an operator's look)."""
    now_ms = int((time.time() if now is None else now) * 1000)
    for bucket, value in zip(buckets, values, strict=True):
        if not value:
            continue
        day = int(bucket.rpartition(":")[2])
        expiry = day * BUCKET_SECONDS * 1000 + int(value[:5], 36) * 10
        if expiry > now_ms:
            owner, _, rest = value[5:].partition("|")
            outcome = rest.partition("|")[2] or PLAIN_OUTCOME
            return ["done", owner, outcome, expiry - now_ms]
    return None


#: Lua: ``find_done(first, count, field, now_ms)`` looks ``field`` up in the buckets
#: KEYS[first .. first+count-1] and answers {owner, fingerprint, outcome, pttl} of a live
#: entry, or nil; ``write_done(first, count, field, now_ms, keep_ms, owner, print,
#: outcome)`` records one in the bucket of its expiry day (the farthest declared one when the
#: keep reaches past them) and makes the bucket last until that day ends.
LUA: Final = f"""
local DAY_MS = {BUCKET_SECONDS * 1000}
local OWNER_CHARS = {OWNER_CHARS}
local function bucket_day(name)
  return tonumber(string.match(name, ':(%d+)$'))
end
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function find_done(first, count, field, now_ms)
  local last = first + count - 1
  for i = first, last do
    -- the last bucket (the oldest: yesterday's for a reader's clock) may be of a day that
    -- has ended, and so hold no live entry (each expires within its day): then not read.
    -- Only it is checked (the others' days go on, but for a reader's clock far behind,
    -- whose read finds their entries expired anyway)
    local value = (i < last or (bucket_day(KEYS[i]) + 1) * DAY_MS > now_ms)
      and redis.call('HGET', KEYS[i], field)
    if value then
      local expiry = bucket_day(KEYS[i]) * DAY_MS + tonumber(string.sub(value, 1, 5), 36) * 10
      if expiry > now_ms then
        local rest = string.sub(value, 6)
        local owner, printed, outcome = string.match(rest, '^([^|]*)|([^|]*)|?(.*)$')
        if outcome == '' then outcome = '{PLAIN_OUTCOME}' end
        return {{owner, printed, outcome, expiry - now_ms}}
      end
    end
  end
  return nil
end
local function to36(n)
  local digits, out = '0123456789abcdefghijklmnopqrstuvwxyz', ''
  for _ = 1, 5 do
    local d = n % 36
    out = string.sub(digits, d + 1, d + 1) .. out
    n = math.floor(n / 36)
  end
  return out
end
local function done_bucket(first, count, expiry)
  for i = first, first + count - 1 do
    local day_start = bucket_day(KEYS[i]) * DAY_MS
    if day_start <= expiry and expiry < day_start + DAY_MS then return i end
  end
  if expiry < bucket_day(KEYS[first + count - 1]) * DAY_MS then return first + count - 1 end
  return first
end
local function write_done(first, count, field, now_ms, keep_ms, owner, printed, outcome)
  local expiry = now_ms + keep_ms
  local index = done_bucket(first, count, expiry)
  local day_start = bucket_day(KEYS[index]) * DAY_MS
  if expiry < day_start then expiry = day_start end
  if expiry >= day_start + DAY_MS then expiry = day_start + DAY_MS - 10 end
  local value = to36(math.ceil((expiry - day_start) / 10)) .. string.sub(owner, 1, OWNER_CHARS)
    .. '|' .. printed
  if outcome ~= '{PLAIN_OUTCOME}' then value = value .. '|' .. outcome end
  redis.call('HSET', KEYS[index], field, value)
  local ends = day_start + DAY_MS
  if redis.call('PEXPIRETIME', KEYS[index]) < ends then
    redis.call('PEXPIREAT', KEYS[index], ends)
  end
end
"""
