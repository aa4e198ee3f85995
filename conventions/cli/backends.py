"""Bounded waits for the ``conventions`` command, and which backend did not answer.

A command run by an operator (or a cron, or a health check) must answer within seconds
whatever the broker, the store, the result backend or the outbox's database do. The app's
own settings are made for workers (retry the broker without end, retry every result
read while the backend is down): :func:`bounded` replaces them, for the command's
duration only, with waits of ``timeout`` seconds and no retry loop, and puts them back
afterwards (a command run in-process, as the tests do, leaves the app as it found it).

:func:`conventions.store.outages.unreachable` tells a backend that did not answer
(refused, timed out, reset) from any other fault, :func:`not_redis` one that answered
but not in Redis's protocol (another service at the store's address: PostgreSQL, a web
server), and :func:`describe` says which backend it was, in one line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis

from conventions.config import settings
from conventions.errors import ConfigurationError
from conventions.store import resolve_url

#: how many links of an exception's cause or context are followed
CHAIN = 5
#: the longest reason :func:`describe` quotes (a server's garbage may be long)
REASON_MAX = 300
#: seconds a command waits for a connection, and for each reply, without ``--timeout``
DEFAULT_TIMEOUT = 5.0
#: how long (seconds) a reply from the Redis broker may take on top of the timeout: an
#: idle poll of the broker's transport blocks that long before it answers
BROKER_POLL = 1.0
#: the app's settings :func:`bounded` replaces while a command runs
REPLACED = (
    "broker_connection_timeout",
    "broker_transport_options",
    "redis_socket_connect_timeout",
    "redis_socket_timeout",
    "result_backend_always_retry",
    "conventions_store_url",
)
_REDIS = ("redis", "rediss", "unix")
_POSTGRES = ("postgresql", "postgres", "postgresql+psycopg")


def with_timeouts(url: str, timeout: float) -> str:
    """``url`` with connect and read timeouts in its query (Redis: ``socket_timeout`` and
    ``socket_connect_timeout``; PostgreSQL: ``connect_timeout``); another URL unchanged.
    A timeout the URL already sets is kept."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in _REDIS:
        wanted = {"socket_connect_timeout": f"{timeout:g}", "socket_timeout": f"{timeout:g}"}
    elif scheme in _POSTGRES:
        wanted = {"connect_timeout": str(max(1, round(timeout)))}  # libpq: whole seconds
    else:
        return url
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query = {**wanted, **query}
    return urlunsplit(parts._replace(query=urlencode(query)))


def _replacements(conf: Any, timeout: float) -> dict[str, Any]:
    transport = dict(conf.get("broker_transport_options") or {})
    transport["max_retries"] = 0  # one attempt to connect: the error is the answer
    broker = str(conf.get("broker_url") or "")
    if urlsplit(broker.split(";", maxsplit=1)[0]).scheme.lower() in _REDIS:
        transport.setdefault("socket_connect_timeout", timeout)
        transport.setdefault("socket_timeout", timeout + BROKER_POLL)
    out: dict[str, Any] = {
        "broker_connection_timeout": timeout,
        "broker_transport_options": transport,
        "redis_socket_connect_timeout": timeout,
        "redis_socket_timeout": timeout,
        "result_backend_always_retry": False,
    }
    store = conf.get("conventions_store_url")
    if store:
        try:
            resolve_url(str(store))  # a URL no store serves is a usage error, one line
        except ValueError as exc:
            raise ConfigurationError(f"conventions_store_url: {exc}") from None
        out["conventions_store_url"] = with_timeouts(str(store), timeout)
    return out


@contextmanager
def bounded(app: Any, timeout: float) -> Iterator[None]:
    """Run with every connection the app opens bounded by ``timeout`` seconds.

    A store the app opened already (a caller in the same process, a test's own store) is
    left as it is; one opened here is dropped afterwards, so the app's next use of it
    reopens it with the app's own settings."""
    conf = app.conf
    missing = object()
    saved = {name: conf.get(name, missing) for name in REPLACED}
    store_was_open = "_cc_store" in app.__dict__  # App.store's cache (conventions.app)
    conf.update(_replacements(conf, timeout))
    _forget_connections(app, store=not store_was_open)
    own = {name: value for name, value in saved.items() if value is not missing}
    app.__dict__[_OWN] = (own, {name for name in saved if name not in own})
    try:
        yield
    finally:
        app.__dict__.pop(_OWN, None)
        for name, value in saved.items():
            if value is missing:
                conf.pop(name, None)
            else:
                conf[name] = value
        _forget_connections(app, store=not store_was_open)


#: where :func:`bounded` keeps the app's own values of what it replaced
_OWN = "_cc_own_settings"


class OwnSettings(Mapping[str, Any]):
    """The app's configuration as the app set it, the command's bounded replacements
    (:data:`REPLACED`) left out: what a check of the app's settings must read (the
    doctor), not what this command runs with."""

    def __init__(self, conf: Any, saved: dict[str, Any], absent: set[str]) -> None:
        self._conf, self._saved, self._absent = conf, saved, absent

    def __getitem__(self, key: str) -> Any:
        if key in self._absent:
            raise KeyError(key)
        return self._saved[key] if key in self._saved else self._conf[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key in self._conf if key not in self._absent)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getattr__(self, name: str) -> Any:  # Celery's conf reads settings as attributes
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def own_settings(app: Any) -> Mapping[str, Any]:
    """``app.conf`` without the bounded replacements of a running command (the conf
    itself outside one)."""
    kept = app.__dict__.get(_OWN)
    if kept is None:
        return app.conf  # type: ignore[no-any-return]
    saved, absent = kept
    return OwnSettings(app.conf, saved, absent)


def _forget_connections(app: Any, *, store: bool) -> None:
    """Drop what was opened with the settings in force, so that the next use reopens it
    with the current ones: this thread's result backend, and (``store``) the store and
    the layer's settings read from the conf."""
    if store:
        app.__dict__.pop("conventions_settings", None)
        opened = app.__dict__.get("_cc_store")
        if opened is not None:
            opened.close()  # its connections closed now, not left to the garbage collector
        reset = getattr(app, "reset_store", None)
        if callable(reset):
            reset()
    local = getattr(app, "_local", None)
    if local is not None:
        backend = local.__dict__.pop("backend", None)
        client = getattr(backend, "__dict__", {}).get("client")  # made, not made here
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            pool.disconnect()  # its sockets closed now, not left to the garbage collector


def _plain(url: str) -> str:
    """``url`` without a backend class prefix (``module:Class+redis://``) or a query."""
    tail = url.split("+", 1)[1] if "+" in url.split("://", 1)[0] else url
    return tail.split("?", 1)[0]


def _where(url: str) -> str:
    parts = urlsplit(_plain(url))
    try:
        port = parts.port
    except ValueError:
        return ""
    return f"{parts.hostname}:{port}" if parts.hostname and port else ""


def _mentions(reason: str, where: str) -> bool:
    """Does the error name this server (``host:port``, or libpq's ``"host", port N``)?"""
    host, _, port = where.rpartition(":")
    return where in reason or (host in reason and f"port {port}" in reason)


def _names(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from (or while handling), :data:`CHAIN` links."""
    link: BaseException | None = exc
    for _ in range(CHAIN):
        if link is None:
            return
        yield link
        link = link.__cause__ or link.__context__


def not_redis(exc: BaseException) -> bool:
    """Did ``exc`` come from a server that answered, but not in Redis's protocol? Its
    bytes are no Redis reply (redis-py's ``InvalidResponse``), or a reply of another
    shape than Redis's made redis-py's own connection code fail (a server answering
    ``+OK`` to everything: an ``AttributeError`` inside the handshake)."""
    return any(
        isinstance(link, redis.exceptions.InvalidResponse)
        or (not isinstance(link, (redis.RedisError, OSError)) and _connection_address(link))
        for link in _chain(exc)
    )


def _connection_address(exc: BaseException) -> str:
    """``host:port`` of the redis-py connection in whose frames ``exc`` was raised, else
    "" (its message does not always name it: "Connection closed by server.")."""
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        host, port = getattr(owner, "host", None), getattr(owner, "port", None)
        if isinstance(owner, redis.connection.AbstractConnection) and host and port:
            return f"{host}:{port}"
        tb = tb.tb_next
    return ""


def describe(exc: BaseException, app: Any, extra: dict[str, str] | None = None) -> str:
    """One line: which backend (by matching its address to the app's URLs) and why: it
    did not answer, or (:func:`not_redis`) answered in another protocol."""
    cause = getattr(exc, "orig", None) or exc  # SQLAlchemy's: the driver's own words
    reason = " ".join(str(cause).split())[:REASON_MAX] or type(exc).__name__
    what = (
        "answered, but not in Redis's protocol (is another service at that address?)"
        if not_redis(exc)
        else "did not answer"
    )
    # every node of a failover list (``amqp://a;amqp://b``) is the broker: the error may name any
    brokers = settings.failover_urls(app.conf.get("broker_url")) or [""]
    urls = [
        *(("the broker", url) for url in brokers),
        ("the result backend", str(app.conf.get("result_backend") or "")),
        ("the store", str(app.conf.get("conventions_store_url") or "")),
        *(extra or {}).items(),
    ]
    servers: dict[str, list[str]] = {}
    shown: dict[str, str] = {}
    for name, url in urls:
        where = _where(url)
        if where and name not in servers.get(where, []):
            servers.setdefault(where, []).append(name)
            shown.setdefault(where, settings.mask_url(_plain(url)))
    named = [where for where in servers if _mentions(reason, where)]
    raised_in = [_connection_address(link) for link in _chain(exc)]
    named = named or [where for where in raised_in if where in servers][:1]
    if not named and len(servers) == 1:  # one server for everything: it is the one
        named = list(servers)
    if named:
        where = named[0]
        return f"{_names(servers[where])} ({shown[where]}) {what}: {reason}"
    backend = getattr(exc, "backend", "")
    if backend:
        return f"the {backend} {what}: {reason}"
    return f"a backend {what} ({', '.join(shown.values()) or 'none'}): {reason}"
