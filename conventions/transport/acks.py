"""Acks that ride the consumer's next fetch instead of a round trip of their own.

kombu's Redis ack is a transaction of its own (``MULTI``, ``ZREM`` of the unacked index,
``HDEL`` of the unacked record, ``EXEC``): one round trip per job, sent by the worker's
event loop right after the job ends, which then sends its next fetch. Here an ack made
on the event loop's thread while no fetch of the channel is in flight is held, and the
next fetch's write carries it (:meth:`conventions.transport.redis.Channel._send`): the
``ZREM`` and the ``HDEL`` go first, their replies skipped (``CLIENT REPLY SKIP``), then
the fetch, on the same connection. Redis runs them in order, so the message leaves the
unacked set before the fetch can take the next one.

An ack is held only when a fetch is sure to follow at once: the channel consumes (it
has a keeper and queues), no fetch is in flight (that one would block for up to the
idle block; the ack then goes out on its own, as kombu's), it was made on the thread
that sends the fetches (a thread pool's acks go out on their own) and the consumer can
take another message (else none would be fetched). A channel that stops consuming, or
closes, sends what it holds first (:meth:`Held.commands` through a pipeline). A held ack
that never reaches Redis (the connection lost with it) leaves its message in the unacked
set: given back after the visibility timeout, the convention job finds its key done in
the ledger and is skipped, as when kombu's own ack fails.
"""

from __future__ import annotations

from typing import Any

#: the most acks held for one fetch (a larger prefetch sends the rest on their own)
HELD_MAX = 64


class Held:
    """The delivery tags a channel holds for its next fetch's write."""

    __slots__ = ("tags",)

    def __init__(self) -> None:
        self.tags: list[str] = []

    def __len__(self) -> int:
        return len(self.tags)

    def hold(self, tag: str) -> bool:
        """Keep ``tag``'s ack for the next fetch; False when full (send it now)."""
        if len(self.tags) >= HELD_MAX:
            return False
        self.tags.append(tag)
        return True

    def commands(self, index_key: str, unacked_key: str) -> list[list[Any]]:
        """The held acks as commands sent ahead of a fetch, replies skipped."""
        tags = self.tags
        if not tags:
            return []
        return [
            ["CLIENT", "REPLY", "SKIP"],
            ["ZREM", index_key, *tags],
            ["CLIENT", "REPLY", "SKIP"],
            ["HDEL", unacked_key, *tags],
        ]

    def take(self) -> list[str]:
        """The held tags, no longer held (sent, or about to be)."""
        tags, self.tags = self.tags, []
        return tags
