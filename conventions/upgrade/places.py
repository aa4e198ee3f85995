"""Where the layer keeps data, each with its stamp: the store (Redis or SQL) and, when
the broker runs the layer's Redis transport, the transport's keys on the broker.

Each format's version comes from :mod:`conventions.config.formats`; a format only tests
register has the version of its highest step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from conventions.config import formats, sentinel
from conventions.ops.doctor_time import layer_transport
from conventions.store import stamps
from conventions.store.stamps import RedisStamp, Stamp
from conventions.upgrade.steps import Kind, Step

#: the format each kind of place keeps
FORMATS: Final[dict[Kind, str]] = {
    "redis_store": "store_redis",
    "sql_store": "store_sql",
    "transport": "transport_layout",
}
#: the version an unstamped place holding data is recognized at: what every release
#: before the stamp wrote (the doctor stamps it so at worker start, the SQL store at its
#: first use); a migrate starts an unstamped place at 0, whose step to 1 stamps it
RECOGNIZED: Final = 1


@dataclass
class Place:
    """One place: its kind, its stamp, and what its steps work on (the store, or the
    broker's Redis client)."""

    kind: Kind
    stamp: Stamp
    handle: Any
    #: for people: ``the store (redis cc:format)``
    label: str

    def formats(self, steps: list[Step]) -> list[str]:
        """The formats kept here: the kind's own, then those of registered steps."""
        found = [FORMATS[self.kind]]
        found += sorted({s.format for s in steps if s.kind == self.kind} - set(found))
        return found


def known(format_name: str) -> bool:
    """Is ``format_name`` one of this release's formats (not a test's)?"""
    return format_name in formats.READS_FROM


def current(format_name: str, steps: list[Step]) -> int:
    """This release's version of ``format_name`` (read at call time, so that a test can
    play a newer release); a test's format: its highest step's."""
    if known(format_name):
        return formats.current(format_name)
    return max((s.version for s in steps if s.format == format_name), default=0)


def store_place(store: Any) -> Place | None:
    """The store's place (a RedisStore or a SQLStore; None for a store of another kind,
    which keeps no stamp)."""
    if hasattr(store, "client") and hasattr(store, "prefix"):
        stamp: Stamp = RedisStamp(store.client, stamps.redis_key(store.prefix))
        return Place("redis_store", stamp, store, f"the store ({stamp.where})")
    if not (hasattr(store, "_engine") and hasattr(store, "table_prefix")):
        return None
    from conventions.store.sql_stamps import SQLStamp

    sql = SQLStamp(store._engine, store.table_prefix)
    return Place("sql_store", sql, store, f"the store ({sql.where})")


@contextlib.contextmanager
def places(app: Any, timeout: float | None = None) -> Iterator[list[Place]]:
    """The app's places (the broker's client is closed after)."""
    own = store_place(app.store)
    found = [] if own is None else [own]
    conf = app.conf
    client = None
    if layer_transport(conf):
        url = str(conf.get("broker_url"))
        options = conf.get("broker_transport_options")
        bounds = (
            {}
            if timeout is None
            else {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        )
        client = sentinel.broker_client(url, options, decode_responses=True, **bounds)
        stamp = RedisStamp(client, stamps.TRANSPORT_KEY)
        found.append(Place("transport", stamp, client, f"the transport ({stamp.where})"))
    try:
        yield found
    finally:
        if client is not None:
            client.close()
