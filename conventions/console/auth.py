"""Who is asking, and may they: the authorizer and the roles.

The console never has users of its own. The host app passes an *authorizer*: a callable
of the request (Starlette's ``Request``; under a mount it carries the host's session and
``scope``) returning a :class:`Principal` (an actor and a role), or None for "not
allowed in". Every action is attributed to that actor, never to a name the request
declares. Three roles, each allowed what the one before is plus more (Oban Web's access
levels): ``read-only`` sees everything and changes nothing, ``operator`` replays,
triggers, pauses queues, discards dead letters and ends a stuck batch member by hand,
``admin`` also replays a task declared ``replayable=False`` and re-runs a job that ended.
"""

from __future__ import annotations

import getpass
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

#: the host names that are this machine (besides loopback addresses)
LOOPBACK_NAMES = frozenset({"localhost"})


class Role(StrEnum):
    READ_ONLY = "read-only"
    OPERATOR = "operator"
    ADMIN = "admin"


#: each role's rank: a role may do what any role of a lower rank may
RANK = {Role.READ_ONLY: 0, Role.OPERATOR: 1, Role.ADMIN: 2}

#: the actions of the console and the least role each needs
ACTIONS: dict[str, Role] = {
    "view": Role.READ_ONLY,
    "replay": Role.OPERATOR,
    "trigger": Role.OPERATOR,
    "pause": Role.OPERATOR,
    #: deleting dead letters (with a reason, audited)
    "discard": Role.OPERATOR,
    #: ending a pending batch member by hand (with a reason, audited)
    "end-member": Role.OPERATOR,
    #: running a job again that ended (succeeded, say), with a reason, audited
    "rerun": Role.ADMIN,
    #: replaying a task declared ``replayable=False``, or a record replayed already
    "force-replay": Role.ADMIN,
}


@dataclass(frozen=True)
class Principal:
    """The one the authorizer let in: the actor recorded in the audit, and their role."""

    actor: str
    role: Role

    def __post_init__(self) -> None:
        if not self.actor.strip():
            raise ValueError("a console principal needs a non-empty actor")
        object.__setattr__(self, "role", Role(self.role))

    def may(self, action: str) -> bool:
        """Is this principal allowed ``action`` (a key of ``ACTIONS``)?"""
        return RANK[self.role] >= RANK[ACTIONS[action]]


#: the host app's authorizer: the request in, a principal (or None: refused) out
Authorizer = Callable[[Any], "Principal | Awaitable[Principal | None] | None"]


def is_loopback(host: str | None) -> bool:
    """Is ``host`` (a client address or a bind address) this machine?"""
    if not host:
        return False
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_admin(request: Any) -> Principal | None:
    """The insecure-local authorizer: an admin named after the OS user, for a client on
    this machine only (``conventions web --insecure-local``); anyone else is refused.

    The page must also be asked for by a loopback name (``Host: 127.0.0.1:8700`` or
    ``localhost``): a web page whose domain was re-pointed at 127.0.0.1 (DNS
    rebinding) sends its own host name, and is refused."""
    client = getattr(request, "client", None)
    if client is None or not is_loopback(client.host):
        return None
    if not is_loopback(request.url.hostname):
        return None
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "local"
    return Principal(f"local:{user}", Role.ADMIN)
