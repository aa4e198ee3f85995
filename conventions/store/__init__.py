"""The store: one :class:`Store` contract, a Redis and a SQL backend, chosen by URL.

``open_store`` maps a URL scheme to a backend so that settings hold one string::

    open_store("redis://localhost:6379/0")                   # RedisStore
    open_store("postgresql://app@db/app")                    # SQLStore (psycopg 3)
    open_store("sqlite:////var/lib/app/conventions.db")      # SQLStore
"""

from __future__ import annotations

from conventions.store.base import Store
from conventions.store.redis import RedisStore
from conventions.store.sql import SQLStore

__all__ = ["RedisStore", "SQLStore", "Store", "open_store"]

#: URL schemes served by :class:`RedisStore`
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: URL schemes served by :class:`SQLStore`, and what each becomes (psycopg 3 for PostgreSQL)
SQL_SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
}


def open_store(url: str) -> Store:
    """The store for ``url``, chosen by its scheme.

    ``postgresql://`` and ``postgres://`` are read as ``postgresql+psycopg://`` (the driver
    this package depends on). Any other scheme is a ValueError naming those accepted.
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme in REDIS_SCHEMES:
        return RedisStore(url)
    if sep and scheme in SQL_SCHEMES:
        return SQLStore(f"{SQL_SCHEMES[scheme]}://{rest}")
    accepted = ", ".join(f"{name}://" for name in (*REDIS_SCHEMES, *SQL_SCHEMES))
    raise ValueError(f"unsupported store URL {url!r}: the scheme must be one of {accepted}")
