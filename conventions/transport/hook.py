"""The push hook: a publish of the layer's task pushes through a script of its own
(:mod:`conventions.transport.publish`) in place of kombu's ``LPUSH``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    push: Callable[[Any, str, str], None]
    ran: bool = False
    push_delayed: Callable[[Any, str, float, str], None] | None = None


_HOOK: ContextVar[PushHook | None] = ContextVar("conventions_push_hook", default=None)


@contextmanager
def pushing_through(hook: PushHook) -> Iterator[PushHook]:
    """Publish the message of ``hook.task_id`` through ``hook`` within the block."""
    token = _HOOK.set(hook)
    try:
        yield hook
    finally:
        _HOOK.reset(token)
