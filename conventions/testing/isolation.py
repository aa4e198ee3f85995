"""The app under test, cut off from every server it is configured for, for one test.

``isolated(app, store_url, clock)`` points the user's own app, for the duration of a
``with`` block, at:

* the broker ``memory://`` (kombu's real in-memory transport): what the code publishes
  stays in this process, where the kit reads it (nothing reaches a real broker);
* Celery's in-memory result backend (``cache+memory://``);
* a store of the test's own: a SQLite file under the test's temporary folder by default,
  or a Redis database the test owns (emptied before the test);
* the virtual clock, as Celery's ``app.now`` (a countdown becomes an ETA on it) and as
  the schedules' clock offset.

Everything else (workloads, routes, decisions, limits, the reliable profile) stays the
app's own. The safe maximum countdown is the one the app's real broker would allow, so
a countdown refused in production is refused in the test. On the way out every setting
goes back as it was and the test's store is closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from celery.backends.cache import CacheBackend

from conventions.config import settings
from conventions.errors import ConfigurationError
from conventions.schedules import cadence
from conventions.store import open_store
from conventions.store.base import Store
from conventions.testing.clock import VirtualClock

logger = logging.getLogger("conventions.testing")

#: the broker of every test: kombu's in-memory transport
MEMORY_BROKER = "memory://"
#: Celery's in-memory result backend
MEMORY_RESULTS = "cache+memory://"
#: what the layer caches on an app, worked out from its settings (forgotten on the way
#: in and out: recomputed from the settings in force)
_CACHED = ("conventions_settings", "_cc_store", "_cc_onetrip", "_cc_scheduled_tasks")
#: the environment variables Celery prefers to the app's settings
_OVERRIDING = ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL")


def forget(app: Any) -> None:
    """Drop the connections and caches an app made from the settings it had."""
    for name in _CACHED:
        app.__dict__.pop(name, None)
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None
    app._backend_cache = None
    app._local = threading.local()


def close_connections(app: Any) -> None:
    """Close the connections the app holds to real servers (its broker connection and
    producer pools, its result backend's client and subscription) before they are
    forgotten: a pool dropped open is closed by the garbage collector, whenever that
    runs, with a ``ResourceWarning`` that ``filterwarnings = error`` turns into a failed
    test run now and then."""
    amqp = app.__dict__.get("amqp")
    for pool in (app._pool, amqp._producer_pool if amqp is not None else None):
        if pool is not None:
            _quietly(pool.force_close_all)
    for backend in {id(b): b for b in _backends(app)}.values():
        _close_backend(backend)


def _backends(app: Any) -> list[Any]:
    """The result backends the app holds for this thread (and its shared one)."""
    found = [getattr(app._local, "backend", None), app._backend_cache]
    return [backend for backend in found if backend is not None]


def _close_backend(backend: Any) -> None:
    """Close a Redis result backend's connections: its result consumer's subscription
    and its client's pool (only what it opened: nothing is made to be closed)."""
    consumer = backend.__dict__.get("result_consumer")
    if consumer is not None and hasattr(consumer, "stop"):
        _quietly(consumer.stop)
    client = backend.__dict__.get("client")
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        _quietly(pool.disconnect)


def _quietly(close: Any) -> None:
    try:
        close()
    except Exception:  # closing what is already gone: nothing to keep
        logger.debug("could not close %r", close, exc_info=True)


def _checked_environment() -> None:
    found = [name for name in _OVERRIDING if os.environ.get(name)]
    if found:
        raise ConfigurationError(
            f"{', '.join(found)} is set: Celery prefers it to the app's settings, so the "
            "test kit cannot keep the test's messages in memory; unset it for the tests"
        )


def empty_redis(url: str) -> None:
    """Empty the Redis database ``url`` names (one the test owns)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


@contextlib.contextmanager
def isolated(app: Any, store_url: str, clock: VirtualClock) -> Iterator[Store]:
    """Run the block with ``app`` on the memory broker, an in-memory result backend, the
    store at ``store_url`` and ``clock``; yields the test's store."""
    _checked_environment()
    conf = app.conf
    production = settings.read(conf)
    overrides: dict[str, Any] = {
        "broker_url": MEMORY_BROKER,
        "broker_read_url": MEMORY_BROKER,
        "broker_write_url": MEMORY_BROKER,
        "broker_transport": None,
        "result_backend": MEMORY_RESULTS,
        "task_always_eager": False,
        "conventions_store_url": store_url,
        "conventions_max_countdown": production.max_countdown,
        "conventions_clock_offset_seconds": clock.offset(),
    }
    saved = {name: conf.get(name) for name in overrides}
    if store_url.startswith(("redis://", "rediss://", "unix://")):
        empty_redis(store_url)
    forget(app)
    conf.update(overrides)

    def follow(_: Any) -> None:
        conf.conventions_clock_offset_seconds = clock.offset()
        cadence.set_clock_offset(clock.offset())

    store: Store | None = None
    try:
        app._backend = CacheBackend(app=app, backend="memory")
        app.now = clock.now
        clock.after_move.append(follow)
        follow(None)
        store = open_store(store_url, **settings.store_options(settings.read(conf)))
        app.__dict__["_cc_store"] = store
        yield store
    finally:  # the app as it was, whatever failed on the way in
        if follow in clock.after_move:
            clock.after_move.remove(follow)
        cadence.set_clock_offset(float(saved["conventions_clock_offset_seconds"] or 0.0))
        app.__dict__.pop("now", None)
        conf.update(saved)
        forget(app)
        if store is not None:
            store.close()
