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

The due time is the publisher's clock (as Celery's ``eta`` is), compared with the mover's
clock plus ``clock_offset`` (a test shifts it); keep the fleet's clocks in sync (NTP).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kombu.utils.json import dumps

from conventions.tracing import headers as hdr
from conventions.transport.layout import DELAYED

#: members a mover moves per call at most: a bounded script, whatever the backlog
MOVE_LIMIT = 100
#: the separator of a member's list key and message (a JSON text has no raw newline)
SEP = "\n"

#: KEYS: delayed sets; ARGV: now (Unix s), limit -> {moved, next due or ""}. Due members
#: go to the tail of their list (LPUSH: the fetch takes from the right) oldest first.
MOVE = """
local left = tonumber(ARGV[2])
local moved = 0
local nextdue = nil
for i = 1, #KEYS do
  if left > 0 then
    local due = redis.call('ZRANGE', KEYS[i], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, left)
    for _, member in ipairs(due) do
      local cut = string.find(member, '\\n', 1, true)
      if cut then
        redis.call('LPUSH', string.sub(member, 1, cut - 1), string.sub(member, cut + 1))
      end
      redis.call('ZREM', KEYS[i], member)
      moved = moved + 1
      left = left - 1
    end
  end
  local first = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
  if first[2] then
    local score = tonumber(first[2])
    if nextdue == nil or score < nextdue then nextdue = score end
  end
end
return {moved, nextdue and string.format('%.6f', nextdue) or ''}
"""


@dataclass(frozen=True)
class Moved:
    """What one mover call did."""

    moved: int
    #: due time of the next member of the sets it looked at (Unix s), None if none
    next_due: float | None


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
    headers = dict(message.get("headers") or {})
    headers["eta"] = None
    headers[hdr.DUE] = datetime.fromtimestamp(due, UTC).isoformat()
    return list_key + SEP + str(dumps({**message, "headers": headers}))


def key_of(queue: str) -> str:
    """The delayed set of ``queue``."""
    return DELAYED.format(queue=queue)


def move(client: Any, script: Any, queues: list[str], now: float, limit: int = MOVE_LIMIT) -> (
    Moved
):  # fmt: skip
    """Run the mover (``script``: :data:`MOVE` registered on ``client``) over the delayed
    sets of ``queues``."""
    if not queues:
        return Moved(0, None)
    moved, next_due = script(keys=[key_of(q) for q in queues], args=[repr(now), limit],
                             client=client)  # fmt: skip
    text = next_due.decode() if isinstance(next_due, bytes) else str(next_due or "")
    return Moved(int(moved), float(text) if text else None)
