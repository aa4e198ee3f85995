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
from conventions.transport.layout import BELL, BELL_CAP, BELL_TTL, DELAYED, MOVER, PRIORITY_SEP

#: members a mover moves per call at most: a bounded script, whatever the backlog
MOVE_LIMIT = 100
#: the separator of a member's list key and message (a JSON text has no raw newline)
SEP = "\n"

#: KEYS: delayed sets, then as many turns (:data:`~conventions.transport.layout.MOVER`,
#: one per queue, or none); ARGV: seconds added to the Redis clock (tests: 0), limit,
#: the mover's id, how long a turn lasts (ms) -> {moved, next due or "", now, turns
#: held}: due on the Redis clock (``TIME``), never the caller's. A set whose turn another
#: live mover holds is left to it; a free turn, or the caller's own, is taken (or
#: renewed) and its set moved. Due members go to the tail of their list (LPUSH: the
#: fetch takes from the right) oldest first, each ringing its queue's bell (an idle
#: consumer of several queues wakes).
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
if #ARGV >= 4 then sets = #KEYS / 2 end
for i = 1, sets do
  local mine = true
  if sets < #KEYS then
    local turn = KEYS[sets + i]
    local holder = redis.call('GET', turn)
    mine = (not holder) or holder == ARGV[3]
    if mine then
      redis.call('SET', turn, ARGV[3], 'PX', tonumber(ARGV[4]))
      held = held + 1
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
  end
end
return {moved, nextdue and string.format('%.6f', nextdue) or '', now, held}
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
) -> Moved:
    """Run the mover (``script``: :data:`MOVE` registered on ``client``) over the delayed
    sets of ``queues``, on the Redis clock plus ``offset`` seconds (tests only). With a
    ``mover`` id, only the sets whose turn is free or its own, taking each for ``turn``
    seconds; without, all of them."""
    if not queues:
        return Moved(0, None)
    keys = [key_of(q) for q in queues]
    args: list[Any] = [repr(float(offset)), limit]
    if mover is not None:
        keys += [MOVER.format(queue=q) for q in queues]
        args += [mover, max(1, round(turn * 1000))]
    reply = script(keys=keys, args=args, client=client)
    moved, next_due, now = reply[:3]
    text = next_due.decode() if isinstance(next_due, bytes) else str(next_due or "")
    turns = int(reply[3]) if mover is not None and len(reply) > 3 else len(queues)
    return Moved(int(moved), float(text) if text else None, float(now), turns)


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
