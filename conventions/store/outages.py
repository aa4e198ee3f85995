"""What a broker, store or result backend that is down or silent looks like: one answer.

``.delay()`` turns such an error into one ``BackendUnavailable`` line (nothing was
published), the ``conventions`` command into its exit 3 and one line, and a job that
was only recording an audit event after its push lets it go. A configuration fault is
not an outage: a wrong password (redis-py's ``AuthenticationError``) or SQLite's "no
such table" pass unchanged, so their own message reaches whoever must fix them.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import redis
from kombu.exceptions import OperationalError

from conventions.errors import BackendUnavailable

#: what a broker, result backend or store that is down, or does not answer, raises
#: through kombu, redis-py or the socket (Celery's result consumer raises a RuntimeError
#: *from* one of these when it gives up reconnecting)
UNREACHABLE: tuple[type[BaseException], ...] = (
    OperationalError, redis.ConnectionError, redis.TimeoutError, ConnectionError,
    TimeoutError, socket.gaierror,
    # a store on Redis Cluster during a failover: CLUSTERDOWN, TRYAGAIN, a slot no node
    # serves yet, or redis-py's retries used up
    redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)  # fmt: skip
#: how many links of ``__cause__`` are followed (kombu and Celery wrap once or twice)
CHAIN = 5


def _sql_unreachable(exc: BaseException) -> bool:
    # an SQL error comes only from a process that imported SQLAlchemy: a web process
    # that only publishes never pays for importing it here
    sa_exc: Any = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None:
        return False
    if isinstance(exc, sa_exc.InterfaceError):
        return True
    if not isinstance(exc, sa_exc.OperationalError):
        return False
    text = str(exc.orig or exc).lower()
    # SQLite's OperationalError is also "no such table" (a fault, not a lost server)
    return "sqlite" not in type(exc.orig).__module__ or "unable to open" in text


def _one(exc: BaseException) -> bool:
    if isinstance(exc, BackendUnavailable):
        return True
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return False
    return isinstance(exc, UNREACHABLE) or _sql_unreachable(exc)


def unreachable(exc: BaseException) -> bool:
    """Did ``exc`` (or what it was raised from) come from a backend that is down or
    did not answer?"""
    link: BaseException | None = exc
    for _ in range(CHAIN):
        if link is None:
            return False
        if _one(link):
            return True
        link = link.__cause__
    return False
