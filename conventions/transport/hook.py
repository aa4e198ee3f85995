"""The push hook: a publish of the layer's task pushes through a script of its own
(:mod:`conventions.transport.publish`) in place of kombu's ``LPUSH``.

With Celery's ``task-sent`` events on, the push waits for its event: Celery publishes
the message, then the event, each a round trip; the transport keeps the push
(:attr:`PushHook.pending`) and runs it when the event comes, the event's ``PUBLISH``
inside the same script (one round trip for both). :meth:`PushHook.flush` runs a push
whose event never came (an event published through another channel)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass
class PushHook:
    """Pushes one task's message in place of kombu's ``LPUSH``
    (:mod:`conventions.transport.publish`):
    ``push(client, list, body)`` gets the broker connection's client, the Redis list and
    the serialized message; ``push_delayed(client, delayed set, due, member)`` adds a
    message not yet due to its delayed set instead."""

    task_id: str
    #: ``push(client, list, body, events)``: ``events``, the fanout ``PUBLISH``es
    #: (channel, payload) that go in the same script
    push: Callable[[Any, str, str, Sequence[tuple[str, str]]], None]
    ran: bool = False
    push_delayed: Callable[[Any, str, float, str], None] | None = None
    #: keep the push for the task's ``task-sent`` event (Celery sends one)
    with_event: bool = False
    #: the push kept for the event: ``pending(channel, events)`` runs it on ``channel``
    #: (None: the one that kept it)
    pending: Callable[[Any, Sequence[tuple[str, str]]], None] | None = None

    def run_pending(self, channel: Any, events: Sequence[tuple[str, str]]) -> None:
        """Run the push kept for the event, on ``channel`` with ``events`` (a failure
        keeps it, for a retry of the event's publish or :meth:`flush`)."""
        if self.pending is not None:
            self.pending(channel, events)
            self.pending = None
            self.ran = True

    def flush(self) -> None:
        """Run the push still kept (its event went elsewhere, or never came)."""
        self.run_pending(None, ())


_HOOK: ContextVar[PushHook | None] = ContextVar("conventions_push_hook", default=None)


@contextmanager
def pushing_through(hook: PushHook) -> Iterator[PushHook]:
    """Publish the message of ``hook.task_id`` through ``hook`` within the block."""
    token = _HOOK.set(hook)
    try:
        yield hook
    finally:
        _HOOK.reset(token)
