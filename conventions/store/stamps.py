"""The stamp: which version of its formats a store (or the transport's Redis) is at.

One small record per place the layer keeps data, read once at worker and beat start and
by the doctor, written when the place is first used (an unstamped one gets the version
it is recognized at) and by ``conventions migrate`` as each step ends. Nothing reads it
per job.

On Redis it is one hash, :func:`redis_key` (``{prefix}format`` for the store,
``_cc.format`` for the transport's keys), whose fields are:

==========================  ==============================================================
``<format>``                the version the data is at (``store_redis``: ``1``)
``progress:<format>:<v>``   how far the step to version ``v`` got (its own cursor text),
                            deleted when the step ends
``lock``, ``lock_until``    the migrate that holds the lock, and until when (ms, the
                            Redis server's clock)
==========================  ==============================================================

Every write is one script on that one key, so a step's end (its version, its progress
deleted) happens only while its migrate still holds the lock, and on Redis Cluster the
key lives in one slot. :mod:`conventions.store.sql_stamps` keeps the same fields in a
table for the SQL store.
"""

from __future__ import annotations

import re
from typing import Any, Final, Protocol

#: the field holding the lock's owner, and the one holding its expiry
LOCK: Final = "lock"
LOCK_UNTIL: Final = "lock_until"
#: the prefix of a step's progress field: ``progress:<format>:<version>``
PROGRESS: Final = "progress:"
#: the transport's stamp (beside its other ``_cc.*`` keys, conventions.transport.layout)
TRANSPORT_KEY: Final = "_cc.format"
#: the store's stamp, after the store's prefix
STORE_SUFFIX: Final = "format"


#: a format's version as the layer writes it: a whole number, decimal digits only
VERSION: Final = re.compile(r"[0-9]{1,18}")


class LockLost(RuntimeError):
    """The migrate's lock expired (or was taken over) before a step could end: nothing
    of that step's end was written; run the migrate again."""


class InvalidStamp(RuntimeError):
    """A stamp's field the layer never writes: a version that is not a whole number
    (``2.0``, ``abc``), a lock's expiry that is not a time. Refused, never read as
    unstamped nor overwritten: a person sets it right."""


def version_of(where: str, format_name: str, value: str) -> int:
    """The version ``value`` of ``format_name`` in the stamp at ``where``; InvalidStamp
    when it is not one."""
    if not VERSION.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InvalidStamp(
            f"{where}: {format_name} is stamped {shown!r}, not a format version (a whole "
            "number): refused, nothing overwritten; set it to the version the data is at "
            "(docs/howto/migrate.md)"
        )
    return int(value)


def progress_field(format_name: str, version: int) -> str:
    return f"{PROGRESS}{format_name}:{version}"


def redis_key(prefix: str) -> str:
    """The store's stamp key under ``prefix``."""
    return f"{prefix}{STORE_SUFFIX}"


class Stamp(Protocol):
    """What a stamp answers, on Redis or SQL."""

    #: where it is, for people (``redis cc:format``, ``sql cc_schema``)
    where: str

    def read(self) -> dict[str, str]:
        """Every field (versions, progress, lock); empty when unstamped."""
        ...

    def stamp_missing(self, format_name: str, version: int) -> int:
        """Write ``version`` for ``format_name`` unless one is there; the one there now."""
        ...

    def acquire(self, owner: str, ttl: float) -> str | None:
        """Take the lock for ``ttl`` seconds: None when taken, else its holder."""
        ...

    def renew(self, owner: str, ttl: float) -> bool: ...

    def release(self, owner: str) -> None: ...

    def checkpoint(self, owner: str, format_name: str, version: int, cursor: str) -> None:
        """Record how far the step to ``version`` got; LockLost unless ``owner`` holds
        the lock."""
        ...

    def advance(self, owner: str, format_name: str, version: int) -> None:
        """The step to ``version`` ended: write the version and drop its progress;
        LockLost unless ``owner`` holds the lock."""
        ...


def versions(fields: dict[str, str], where: str) -> dict[str, int]:
    """The formats' versions among the fields of the stamp at ``where``; InvalidStamp
    when one is not a version."""
    return {
        name: version_of(where, name, value)
        for name, value in fields.items()
        if not name.startswith(PROGRESS) and name not in (LOCK, LOCK_UNTIL)
    }


# A lock's expiry (ms) from its field, or nil when it is not a finite number (a field the
# layer never writes, as ``abc``); a missing field is 0 (expired).
_EXPIRY = """
local function expiry(raw)
  local n = tonumber(raw or '0')
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return nil end
  return n
end
"""


# KEYS[1] stamp; ARGV owner, ttl ms. Returns {"taken"}, {"held", holder} or, when
# another's lock has an expiry that is not a time, {"invalid", holder, expiry}.
_ACQUIRE = (
    _EXPIRY
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = redis.call('HGET', KEYS[1], 'lock')
local raw = redis.call('HGET', KEYS[1], 'lock_until')
local untl = expiry(raw)
if holder and holder ~= ARGV[1] then
  if untl == nil then return {'invalid', holder, raw} end
  if untl > now then return {'held', holder} end
end
redis.call('HSET', KEYS[1], 'lock', ARGV[1], 'lock_until', now + tonumber(ARGV[2]))
return {'taken'}
"""
)
# KEYS[1] stamp; ARGV owner, ttl ms (0: release). Returns 1 when held (and renewed).
# An expiry that is not a time is not held (a fenced end then raises LockLost).
_RENEW = (
    _EXPIRY
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untl = expiry(redis.call('HGET', KEYS[1], 'lock_until')) or 0
if redis.call('HGET', KEYS[1], 'lock') ~= ARGV[1] or untl <= now then return 0 end
if tonumber(ARGV[2]) == 0 then
  redis.call('HDEL', KEYS[1], 'lock', 'lock_until')
else
  redis.call('HSET', KEYS[1], 'lock_until', now + tonumber(ARGV[2]))
end
return 1
"""
)
# KEYS[1] stamp; ARGV owner, field, value, field to delete (or "").
_FENCED = (
    _EXPIRY
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untl = expiry(redis.call('HGET', KEYS[1], 'lock_until')) or 0
if redis.call('HGET', KEYS[1], 'lock') ~= ARGV[1] or untl <= now then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
if ARGV[4] ~= '' then redis.call('HDEL', KEYS[1], ARGV[4]) end
return 1
"""
)


class RedisStamp:
    """The stamp as one Redis hash (a client made with ``decode_responses=True``)."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self.where = f"redis {key}"

    def read(self) -> dict[str, str]:
        return dict(self.client.hgetall(self.key))

    def stamp_missing(self, format_name: str, version: int) -> int:
        self.client.hsetnx(self.key, format_name, str(version))
        return version_of(self.where, format_name, str(self.client.hget(self.key, format_name)))

    def acquire(self, owner: str, ttl: float) -> str | None:
        answer = self.client.eval(_ACQUIRE, 1, self.key, owner, int(ttl * 1000))
        if answer[0] == "invalid":
            raise InvalidStamp(
                f"{self.where}: the migrate lock of {answer[1]} has {LOCK_UNTIL} "
                f"{str(answer[2])[:40]!r}, not a time (ms): refused, nothing overwritten; "
                f"once no migrate runs, delete the fields {LOCK} and {LOCK_UNTIL}"
            )
        return None if answer[0] == "taken" else str(answer[1])

    def renew(self, owner: str, ttl: float) -> bool:
        return bool(self.client.eval(_RENEW, 1, self.key, owner, max(1, int(ttl * 1000))))

    def release(self, owner: str) -> None:
        self.client.eval(_RENEW, 1, self.key, owner, 0)

    def checkpoint(self, owner: str, format_name: str, version: int, cursor: str) -> None:
        field = progress_field(format_name, version)
        self._fenced(owner, field, cursor, "")

    def advance(self, owner: str, format_name: str, version: int) -> None:
        self._fenced(owner, format_name, str(version), progress_field(format_name, version))

    def _fenced(self, owner: str, field: str, value: str, drop: str) -> None:
        if not self.client.eval(_FENCED, 1, self.key, owner, field, value, drop):
            raise LockLost(f"the migrate lock on {self.where} is no longer {owner}'s")
