"""The store: one :class:`Store` contract, a Redis and a SQL backend, chosen by URL.

``open_store`` maps a URL scheme to a backend so that settings hold one string::

    open_store("redis://localhost:6379/0")                   # RedisStore
    open_store("redis+cluster://10.0.0.1:7000,10.0.0.2:7000/")  # RedisStore on Redis Cluster
    open_store("postgresql://app@db/app")                    # SQLStore (psycopg 3)
    open_store("sqlite:////var/lib/app/conventions.db")      # SQLStore

The SQL backend needs the ``sql`` extra (SQLAlchemy and psycopg): it is imported when a
SQL URL is opened or ``SQLStore`` is first named, never by ``import conventions``.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from conventions.config import cluster
from conventions.store.base import Store
from conventions.store.redis import RedisStore

__all__ = ["RedisStore", "SQLStore", "Store", "open_store", "resolve_url"]

#: what a URL scheme looks like (RFC 3986), so that only a scheme is ever repeated
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]{0,31}$")
#: URL schemes served by :class:`RedisStore`
REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel", "sentinels", *cluster.SCHEMES)
#: URL schemes served by :class:`SQLStore`, and what each becomes (psycopg 3 for PostgreSQL)
SQL_SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
}


def resolve_url(url: str) -> tuple[Literal["redis", "sql"], str]:
    """Which backend serves ``url``, and the URL to give it.

    ``postgresql://`` and ``postgres://`` become ``postgresql+psycopg://`` (the driver this
    package depends on). Any other scheme is a ValueError naming the accepted ones and
    never repeating the URL (its password would reach logs and tracebacks).
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme in cluster.SCHEMES:
        cluster.parse(url)  # a database number is refused here, in one line
        return "redis", url
    if sep and scheme in REDIS_SCHEMES:
        _check_database(url)
        return "redis", url
    if sep and scheme in SQL_SCHEMES:
        return "sql", f"{SQL_SCHEMES[scheme]}://{rest}"
    accepted = ", ".join(f"{name}://" for name in (*REDIS_SCHEMES, *SQL_SCHEMES))
    # the URL itself is not repeated: it may carry a password, and the scheme is the fault
    given = f"scheme {scheme}://" if sep and SCHEME.match(scheme) else "no scheme"
    raise ValueError(f"unsupported store URL ({given}): the scheme must be one of {accepted}")


#: a Redis database as a URL names it: ``/N`` (``redis://``), ``?db=N`` (any scheme)
_DATABASE = re.compile(r"^[0-9]{1,9}$")


def _check_database(url: str) -> None:
    """Refuse a Redis URL whose database is not a number: redis-py would ignore it and
    use database 0, another application's data perhaps (the URL is not repeated)."""
    first = url.split(";", 1)[0]  # sentinel URLs list several servers
    try:
        parts = urlsplit(first)
        query = parse_qs(parts.query)
    except ValueError as exc:
        raise ValueError(f"unsupported store URL: it does not parse ({exc})") from None
    path = parts.path.strip("/") if parts.scheme.lower() in ("redis", "rediss") else ""
    for given in ([path] if path else []) + query.get("db", []):
        if not _DATABASE.match(given):
            raise ValueError(
                "unsupported store URL: its Redis database must be a number "
                f"(/0, /1, ... or ?db=N), not {given[:20]!r}"
            )


def open_store(url: str, **redis_options: Any) -> Store:
    """The store for ``url``, chosen by its scheme (see :func:`resolve_url`);
    ``redis_options`` go to :class:`RedisStore` (the audit trail's ttl and caps; the
    run history's ``runs_*`` go to either store)."""
    backend, resolved = resolve_url(url)
    if backend == "redis":
        return RedisStore(resolved, **redis_options)
    from conventions.store.sql import SQLStore  # MissingExtra without the 'sql' extra

    runs = {name: value for name, value in redis_options.items() if name.startswith("runs_")}
    store: Store = SQLStore(resolved, **runs)
    return store


def __getattr__(name: str) -> Any:
    """``SQLStore``, imported when first named (it needs the ``sql`` extra)."""
    if name == "SQLStore":
        from conventions.store.sql import SQLStore

        return SQLStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
