"""Where the layer's Redis transport keeps time and liveness, and how to read it.

One module names every key the transport writes beside kombu's own (the queue lists,
``unacked`` and ``unacked_index``), so that the transport, the queues view, the exporter,
the doctor and the tests agree on them. Readers here are for operators' views: a few
commands each, never on a job's path.

* ``_cc.delayed.<queue>``: sorted set of the messages of ``queue`` not yet due; score =
  due time (Unix seconds, float), member = ``<list key>`` + ``"\\n"`` + the serialized
  kombu message (a JSON text has no raw newline). The list key is the queue's list, or
  kombu's priority list of the queue. Moved into that list when due.
* ``_cc.consumers``: sorted set of consumers; score = the time (Unix seconds, Redis clock)
  until which the consumer is alive. A live consumer pushes it forward; one whose score
  is in the past is dead, and what it held is given back.
* ``_cc.consumer.<id>``: hash describing one consumer: ``queues`` (comma-separated queue
  names), ``host``, ``pid``, ``since`` (Unix seconds, its clock), ``beat`` (its last
  renewal, Redis clock) and ``skew`` (its clock minus Redis', seconds, as its keeper
  last measured it; empty before the first measure).
* ``_cc.consumers.dead``: hash of dead consumers (field) and when a sweep first found
  their inboxes empty (value, Redis clock); a consumer is forgotten once that is
  ``recovery_timeout`` old.
* ``_cc.inboxes``: hash of every inbox (field) and the list it was filled from (value);
  ``_cc.inbox.<consumer>:<list>`` is one inbox.
* ``_cc.mover.<queue>``: string, the id of the consumer whose turn it is to move the
  queue's delayed set (:mod:`conventions.transport.delayed`), expiring (``PX``)
  :data:`TURN_SLACK` seconds after the holder's planned wake-up (its set's next due
  member, or its longest wait): one consumer of a queue moves it, the others only look
  whether the turn is free, about every ``recovery_timeout / 6``.
* ``_cc.movebell.<queue>``: list of at most one token, rung by every push into the
  queue's delayed set: the turn's holder, asleep until its next due member, waits on it
  (``BLPOP``) and moves again at once. ``_cc.keeperwake.<consumer>``: rung by a
  stopping keeper to end its own wait.
* ``_cc.bell.<queue>``: list of tokens (``"1"``), one pushed with each message the
  layer publishes, moves when due, gives back from a dead consumer's inbox or restores
  into the queue's lists (at most :data:`BELL_CAP`, gone
  :data:`BELL_TTL` seconds after the last), so that an idle
  consumer of several queues wakes at once (``BLPOP`` over its queues' bells) and then
  sweeps its lists. A token is only a hint: the message itself never leaves its list but
  into an inbox, and a consumer whose sweep finds all its lists empty deletes their bells.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kombu.utils.encoding import bytes_to_str

DELAYED = "_cc.delayed.{queue}"
CONSUMERS = "_cc.consumers"
CONSUMER = "_cc.consumer.{consumer}"
DEAD_SINCE = "_cc.consumers.dead"
INBOXES = "_cc.inboxes"
INBOX = "_cc.inbox.{consumer}:{source}"
BELL = "_cc.bell.{queue}"
MOVER = "_cc.mover.{queue}"
#: rung (one token at most) by every push into ``queue``'s delayed set: the holder of its
#: turn, asleep until its next due member, wakes and moves again
MOVER_BELL = "_cc.movebell.{queue}"
#: rung by a keeper's ``stop``: its own wait ends at once
KEEPER_WAKE = "_cc.keeperwake.{consumer}"
#: seconds a mover's turn outlives its planned wake-up (its next due member, or its
#: longest wait): a live mover renews it first; a dead one's lapses this long after a
#: member falls due (a push into the set shortens a longer turn to it)
TURN_SLACK = 3.0
#: tokens a bell holds at most: how many idle consumers one burst wakes at once
BELL_CAP = 100
#: seconds a bell lives after its last ring: a token nobody popped by then announced a
#: message that a timed sweep took long ago (and a queue that no consumer of several
#: queues reads, such as a reply queue, leaves no key behind)
BELL_TTL = 60
#: kombu's priority lists are ``<queue><sep><priority>``
PRIORITY_SEP = "\x06\x16"


def queue_of_list(source: str) -> str:
    """The queue a list belongs to (a priority list's queue, or the list itself)."""
    return source.split(PRIORITY_SEP, 1)[0]


def bell_of(source: str) -> str:
    """The bell of the queue a list belongs to (one per queue, whatever its priority lists)."""
    return BELL.format(queue=queue_of_list(source))


@dataclass(frozen=True)
class Delayed:
    """What a queue's delayed set holds."""

    count: int
    #: due time of the next message (Unix seconds), None when the set is empty
    next_due: float | None


def delayed(client: Any, queue: str) -> Delayed:
    """How many messages of ``queue`` wait for their due time, and the next one's."""
    key = DELAYED.format(queue=queue)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(key)
    pipe.zrange(key, 0, 0, withscores=True)
    count, first = pipe.execute()
    return Delayed(int(count), float(first[0][1]) if first else None)


def server_now(client: Any) -> float:
    """Redis' clock (Unix seconds): the one liveness scores are compared with."""
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1_000_000


def _alive(client: Any, field: str) -> list[tuple[list[str], str]]:
    """Each live consumer's queues and the value of one field of its description."""
    alive = [bytes_to_str(c) for c in client.zrangebyscore(CONSUMERS, server_now(client), "+inf")]
    if not alive:
        return []
    pipe = client.pipeline(transaction=False)
    for consumer in alive:
        pipe.hmget(CONSUMER.format(consumer=consumer), "queues", field)
    return [
        ([q for q in bytes_to_str(queues or b"").split(",") if q], bytes_to_str(value or b""))
        for queues, value in pipe.execute()
    ]


def consumers_alive(client: Any) -> dict[str, int]:
    """Live consumers per queue, from their liveness scores and descriptions."""
    counts: dict[str, int] = {}
    for queues, _ in _alive(client, "queues"):
        for queue in queues:
            counts[queue] = counts.get(queue, 0) + 1
    return counts


def clock_skews(client: Any) -> dict[str, float]:
    """Per queue, the clock skew (seconds, its clock minus Redis') of the live consumer
    of the queue whose clock is farthest from Redis', as its keeper last measured it."""
    worst: dict[str, float] = {}
    for queues, value in _alive(client, "skew"):
        try:
            skew = float(value)
        except ValueError:
            continue  # not measured yet, or an older layer's consumer
        for queue in queues:
            if abs(skew) >= abs(worst.get(queue, 0.0)):
                worst[queue] = skew
    return worst


def in_inboxes_by_queue(client: Any) -> dict[str, int]:
    """Messages fetched into inboxes and not yet claimed or given back, per queue."""
    registry = {bytes_to_str(k): bytes_to_str(v) for k, v in client.hgetall(INBOXES).items()}
    if not registry:
        return {}
    pipe = client.pipeline(transaction=False)
    for inbox in registry:
        pipe.llen(inbox)
    counts: dict[str, int] = {}
    for source, length in zip(registry.values(), pipe.execute(), strict=True):
        if length:
            counts[queue_of_list(source)] = counts.get(queue_of_list(source), 0) + int(length)
    return counts


def in_flight_by_queue(client: Any, unacked_key: str = "unacked") -> dict[str, int]:
    """Messages claimed by a consumer and not yet acknowledged, per queue (kombu's
    unacked hash: ``[message, exchange, routing key]``; the routing key names the queue
    for the layer's direct routes)."""
    counts: dict[str, int] = {}
    for _, raw in client.hscan_iter(unacked_key, count=500):
        try:
            message, _exchange, routing_key = json.loads(raw)
            queue = (message.get("properties") or {}).get("delivery_info", {}).get(
                "routing_key"
            ) or routing_key
        except (ValueError, TypeError, AttributeError):
            queue = "?"
        counts[str(queue)] = counts.get(str(queue), 0) + 1
    return counts
