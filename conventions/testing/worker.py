"""A real worker for integration tests: Celery's own, in a thread, on Redis the test owns.

``real_worker(app, broker_url=..., store_url=...)`` points the app at two Redis
databases the test owns (emptied first and last), starts
``celery.contrib.testing.worker.start_worker`` (a thread pool in this process, on every
queue of the app's workloads: no Docker, no subprocess) and stops it cleanly on the way
out, the app's settings put back as they were. Jobs then go through the real broker,
transport, consumer and result backend: what the in-process kit stands in for.

Each worker started here gets an event loop of its own (:func:`own_event_loop`): Celery's
worker takes kombu's process-wide loop when one is set, so a second in-process worker
started while another runs (a module's worker fixture, then a test's own) would drive the
same loop from two threads, and sooner or later crash with "generator already executing"
or never stop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conventions.testing.isolation import close_connections, empty_redis, forget


@contextlib.contextmanager
def own_event_loop() -> Iterator[None]:
    """Start an in-process worker inside: it makes an event loop (kombu's hub) of its own
    instead of sharing the one a worker already running in this process set; the running
    one's is set back on the way out."""
    from kombu.asynchronous import get_event_loop, set_event_loop

    running = get_event_loop()
    set_event_loop(None)
    try:
        yield
    finally:
        set_event_loop(running)


def _queues(app: Any) -> list[str]:
    return sorted(set(app.amqp.queues))


@contextlib.contextmanager
def real_worker(
    app: Any,
    *,
    broker_url: str,
    store_url: str,
    concurrency: int = 2,
    queues: list[str] | None = None,
    shutdown_timeout: float = 20.0,
) -> Iterator[Any]:
    """Run a thread worker of ``app`` on ``broker_url`` with the store (and the results)
    at ``store_url``; yields Celery's worker controller."""
    from celery.contrib.testing.worker import start_worker

    conf = app.conf
    levels = dict(conf.get("conventions_doctor_levels") or {})
    # the test's Redis databases are throwaway by definition: said, not refused
    levels.setdefault("redis-no-persistence", "warning")
    overrides: dict[str, Any] = {
        "broker_url": broker_url,
        "broker_read_url": None,
        "broker_write_url": None,
        "result_backend": f"conventions.results.redis:RedisBackend+{store_url}",
        "conventions_store_url": store_url,
        "conventions_doctor_levels": levels,
        "task_always_eager": False,
    }
    saved = {name: conf.get(name) for name in overrides}
    for url in (broker_url, store_url):
        empty_redis(url)
    forget(app)
    conf.update(overrides)
    try:
        with (
            own_event_loop(),
            start_worker(
                app,
                pool="threads",
                concurrency=concurrency,
                queues=queues or _queues(app),
                perform_ping_check=False,
                loglevel="WARNING",
                shutdown_timeout=shutdown_timeout,
            ) as worker,
        ):
            yield worker
    finally:
        store = app.__dict__.get("_cc_store")
        if store is not None:
            store.close()
        close_connections(app)
        conf.update(saved)
        forget(app)
        for url in (broker_url, store_url):
            empty_redis(url)
