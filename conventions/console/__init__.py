"""The operator's console: a small web app over the layer's records (the ``console`` extra).

An ASGI app that a FastAPI/Starlette app mounts, that Django serves beside its own ASGI
app, or that ``conventions web`` starts on its own. Its pages show dead letters (and
replay them), a correlation id's trace, the schedule entries (and send an occurrence
now) and the queues. Every request goes through an authorizer of the host app's
choosing (``conventions.console.auth``); every action is audited with the actor it
gives, and every state-changing request carries a CSRF token
(``conventions.console.csrf``). See docs/howto/console.md.

Only ``conventions.console.app`` and the pages need the ``console`` extra; the rest of
the package (roles, tokens, views) imports without it; pausing a queue is
``conventions.ops.pauses`` (a starting worker reads it too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conventions.console.auth import Principal, Role

if TYPE_CHECKING:
    from conventions.console.app import console_app

__all__ = ["Principal", "Role", "console_app"]


def __getattr__(name: str) -> Any:
    """``console_app`` imports the web framework when first asked for (a missing
    ``console`` extra is a ``MissingExtra`` then), so that the parts without one
    (``auth``, ``csrf``, ``views``) import anywhere."""
    if name == "console_app":
        from conventions.console.app import console_app

        return console_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
