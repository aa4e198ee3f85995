"""Delayed delivery inside Redis: a message not yet due waits in a sorted set, never in a
worker's memory.

kombu's Redis transport pushes a message with an ``eta`` (a ``countdown``, a retry's
backoff, a deferral) into its queue at once, and the worker that fetches it holds it
unacknowledged until it is due: past the visibility timeout Redis delivers it again
(celery/kombu#337), so delays had a cap. Here :func:`delay` turns such a message into a
member of ``_cc.delayed.<queue>`` (:mod:`conventions.transport.layout`), scored with its
due time, with the ``eta`` taken out and the due time kept in the ``cc_due`` header (for
the oldest-age figure of the queues view). :data:`MOVE`, run by every consuming worker
(:mod:`conventions.transport.liveness`), moves due members into their list, in due order,
at most ``limit`` per call: the moved message is a plain one, run at once, never held.
A message published twice (kombu retries a publish) is the same member: one job.

Which clock decides: the publisher's clock *writes* the due time (Celery's ``eta`` is the
publisher's ``now`` plus the countdown, or the moment it names), and the **Redis server's
clock decides when it has come**: :data:`MOVE` reads ``TIME`` inside the script, so a
worker whose clock runs fast or slow moves nothing early or late. A publisher whose clock
is off by ``s`` seconds writes due times off by ``s`` (a countdown from a publisher 5 s
behind runs about 5 s early by the real clock, never before the moment it wrote); the
doctor and the keeper measure every process' skew against Redis
(:mod:`conventions.transport.skew`). ``clock_offset`` (tests only) is added to the Redis
clock when due times are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kombu.utils.json import dumps

from conventions.tracing import headers as hdr
from conventions.transport import scripts
from conventions.transport.layout import (
    BELL,
    BELL_CAP,
    BELL_TTL,
    DELAYED,
    MOVER,
    MOVER_BELL,
    PRIORITY_SEP,
    TURN_SLACK,
)

#: members a mover moves per call at most: a bounded script, whatever the backlog
MOVE_LIMIT = 100
#: the separator of a member's list key and message (a JSON text has no raw newline)
SEP = "\n"

#: KEYS: delayed sets, then as many turns (:data:`~conventions.transport.layout.MOVER`,
#: one per queue, or none); ARGV: seconds added to the Redis clock (tests: 0), limit,
#: the mover's id, the turn's slack (ms), the mover's longest wait (ms; 0: none) ->
#: {moved, next due or "", now, turns held, the indexes of the sets held}: due on the
#: Redis clock (``TIME``), never the caller's. A set whose turn another live mover holds
#: is left to it; a free turn, or the caller's own, is taken (or renewed) and its set
#: moved; the turn then lasts until the set's next due member (at most the longest
#: wait) plus the slack: the holder wakes by then. Due members go to the tail of their
#: list (LPUSH: the fetch takes from the right) oldest first, each ringing its queue's
#: bell (an idle consumer of several queues wakes).
_BELL_PREFIX = BELL.split("{", 1)[0]
_LUA_PRIORITY_SEP = "".join(f"\\{ord(c)}" for c in PRIORITY_SEP)
MOVE = (
    f"local bell_prefix = '{_BELL_PREFIX}'\n"
    f"local priority_sep = '{_LUA_PRIORITY_SEP}'\n"
    f"local bell_cap = {BELL_CAP}\n"
    f"local bell_ttl = {BELL_TTL}\n"
    + """
local function ring(list)
  local cut = string.find(list, priority_sep, 1, true)
  local bell = bell_prefix .. (cut and string.sub(list, 1, cut - 1) or list)
  redis.call('LPUSH', bell, '1')
  redis.call('LTRIM', bell, 0, bell_cap - 1)
  redis.call('EXPIRE', bell, bell_ttl)
end
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1]))
local left = tonumber(ARGV[2])
local moved = 0
local nextdue = nil
local sets = #KEYS
local held = 0
local which = {}
local wait = tonumber(ARGV[5] or '0')
if #ARGV >= 4 then sets = #KEYS / 2 end
for i = 1, sets do
  local mine = true
  if sets < #KEYS then
    local turn = KEYS[sets + i]
    local holder = redis.call('GET', turn)
    mine = (not holder) or holder == ARGV[3]
    if mine then
      redis.call('SET', turn, ARGV[3], 'PX', tonumber(ARGV[4]) + wait)
      held = held + 1
      which[#which + 1] = i
    end
  end
  if mine and left > 0 then
    local due = redis.call('ZRANGE', KEYS[i], '-inf', now, 'BYSCORE', 'LIMIT', 0, left)
    for _, member in ipairs(due) do
      local cut = string.find(member, '\\n', 1, true)
      if cut then
        redis.call('LPUSH', string.sub(member, 1, cut - 1), string.sub(member, cut + 1))
        ring(string.sub(member, 1, cut - 1))
      end
      redis.call('ZREM', KEYS[i], member)
      moved = moved + 1
      left = left - 1
    end
  end
  local first = mine and redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES') or {}
  if first[2] then
    local score = tonumber(first[2])
    if nextdue == nil or score < nextdue then nextdue = score end
    if mine and sets < #KEYS and wait > 0 then
      local until_due = math.max(0, math.floor((score - tonumber(now)) * 1000))
      if until_due < wait then
        redis.call('PEXPIRE', KEYS[sets + i], tonumber(ARGV[4]) + until_due)
      end
    end
  end
end
return {moved, nextdue and string.format('%.6f', nextdue) or '', now, held, which}
"""
)


@dataclass(frozen=True)
class Moved:
    """What one mover call did."""

    moved: int
    #: due time of the next member of the sets it looked at (Unix s), None if none
    next_due: float | None
    #: the Redis clock (plus the offset) the script compared due times with
    now: float = 0.0
    #: the queues whose mover's turn the caller holds (all of them without turns)
    turns: int = 0
    #: those queues
    held: tuple[str, ...] = ()

    @property
    def next_in(self) -> float | None:
        """Seconds until the next member falls due, on the Redis clock."""
        return None if self.next_due is None else self.next_due - self.now


def due_of(message: dict[str, Any]) -> float | None:
    """The due time (Unix seconds) of a kombu message's Celery ``eta`` header, or None
    (no eta, or one that cannot be read: Celery's worker deals with it as before)."""
    headers = message.get("headers")
    eta = headers.get("eta") if isinstance(headers, dict) else None
    if not eta:
        return None
    try:
        moment = eta if isinstance(eta, datetime) else datetime.fromisoformat(str(eta))
    except ValueError:
        return None
    if moment.tzinfo is None:  # the profile runs Celery in UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def delay(list_key: str, message: dict[str, Any], due: float) -> str:
    """The delayed-set member of ``message`` (to be pushed into ``list_key`` at ``due``):
    the message without its ``eta``, with ``cc_due``."""
    return list_key + SEP + str(dumps(undelayed(message, due)))


def undelayed(message: dict[str, Any], due: float) -> dict[str, Any]:
    """``message`` as a consumer delivers it once due: without its ``eta`` (Celery's
    worker would hold it until its own clock reaches it: late on a slow clock, early on
    a fast one), with ``cc_due`` for the wait figures."""
    headers = dict(message.get("headers") or {})
    headers["eta"] = None
    headers[hdr.DUE] = datetime.fromtimestamp(due, UTC).isoformat()
    return {**message, "headers": headers}


def key_of(queue: str) -> str:
    """The delayed set of ``queue``."""
    return DELAYED.format(queue=queue)


def move(
    client: Any,
    script: Any,
    queues: list[str],
    offset: float = 0.0,
    limit: int = MOVE_LIMIT,
    *,
    mover: str | None = None,
    turn: float = 0.0,
    wait: float = 0.0,
) -> Moved:
    """Run the mover (``script``: :data:`MOVE` registered on ``client``) over the delayed
    sets of ``queues``, on the Redis clock plus ``offset`` seconds (tests only). With a
    ``mover`` id, only the sets whose turn is free or its own, taking each for ``turn``
    seconds past the mover's next wake-up: its set's next due member, at most ``wait``
    seconds away (0: ``turn`` seconds from now); without, all of them."""
    if not queues:
        return Moved(0, None)
    keys = [key_of(q) for q in queues]
    args: list[Any] = [repr(float(offset)), limit]
    if mover is not None:
        keys += [MOVER.format(queue=q) for q in queues]
        args += [mover, max(1, round(turn * 1000)), max(0, round(wait * 1000))]
    reply = script(keys=keys, args=args, client=client)
    moved, next_due, now = reply[:3]
    text = next_due.decode() if isinstance(next_due, bytes) else str(next_due or "")
    if mover is None or len(reply) <= 3:
        return Moved(int(moved), float(text) if text else None, float(now), len(queues),
                     tuple(queues))  # fmt: skip
    held = tuple(queues[int(i) - 1] for i in (reply[4] if len(reply) > 4 else []))
    return Moved(int(moved), float(text) if text else None, float(now), int(reply[3]), held)


#: KEYS: delayed set, its queue's turn, its queue's mover bell; ARGV: due (Unix s),
#: member, the turn's slack (ms) -> 1. Adds the member, and wakes the turn's holder
#: (asleep until the set's former next due member): one token at most. A turn that would
#: outlast the new member's due time by more than the slack is shortened to it: a holder
#: that died lapses in time for another consumer to move the member.
PUSH = (
    f"""
local bell_ttl = {BELL_TTL}
"""
    + """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local by = math.max(0, math.floor((tonumber(ARGV[1]) - now) * 1000)) + tonumber(ARGV[3])
if redis.call('PTTL', KEYS[2]) > by then redis.call('PEXPIRE', KEYS[2], by) end
redis.call('LPUSH', KEYS[3], '1')
redis.call('LTRIM', KEYS[3], 0, 0)
redis.call('EXPIRE', KEYS[3], bell_ttl)
return 1
"""
)


def queue_of_set(delayed_set: str) -> str:
    """The queue whose delayed set is ``delayed_set``."""
    return delayed_set.removeprefix(DELAYED.format(queue=""))


def push(client: Any, delayed_set: str, due: float, member: str) -> None:
    """Add ``member`` to ``delayed_set``, due at ``due`` (:data:`PUSH`: one command)."""
    queue = queue_of_set(delayed_set)
    keys = [delayed_set, MOVER.format(queue=queue), MOVER_BELL.format(queue=queue)]
    scripts.call(client, PUSH, len(keys), *keys, repr(float(due)), member,
                 round(TURN_SLACK * 1000))  # fmt: skip


#: KEYS: turns; ARGV: mover id -> turns given up (those it held)
GIVE_UP = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
"""


def give_up(client: Any, queues: list[str], mover: str) -> int:
    """Free the turns ``mover`` holds on ``queues`` (its worker stops): another consumer
    of them takes them at its next call, not once they lapse."""
    if not queues:
        return 0
    keys = [MOVER.format(queue=q) for q in queues]
    return int(scripts.call(client, GIVE_UP, len(keys), *keys, mover))
