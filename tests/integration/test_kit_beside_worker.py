"""The kit's in-process worker started while another worker runs in the same process
(a module's worker fixture, then a test's own): each drives an event loop of its own.

Celery's worker takes kombu's process-wide event loop when one is set, so the second
worker used to drive the first one's loop from a second thread: one run in about a
dozen crashed with "generator already executing" in the loop's timers, or never stopped
("Worker thread failed to exit"), the clean-clone CI run's failure of 2026-12-02.
"""

from __future__ import annotations

from typing import Any

from kombu.asynchronous import get_event_loop

from conventions import App
from conventions.testing import real_worker
from tests.conftest import REDIS_BASE

#: databases of this test's own (the real worker empties them first and last)
BROKER, STORE = f"{REDIS_BASE}/12", f"{REDIS_BASE}/13"


def test_a_kit_worker_beside_a_running_worker_has_an_event_loop_of_its_own(
    thread_worker: Any,
) -> None:
    running = thread_worker.hub
    assert running is not None and get_event_loop() is running
    app = App("kit-beside", set_as_current=False)
    app.config_from_object("celeryconfig")
    try:
        with real_worker(app, broker_url=BROKER, store_url=STORE) as kit:
            assert kit.hub is not None
            assert kit.hub is not running  # old: the running worker's, driven from two threads
        assert get_event_loop() is running  # the running worker's loop is set back
    finally:
        app.close()


def test_a_kit_worker_closes_the_connections_the_app_opened_on_its_way_out(
    services: None,
) -> None:
    """The app's broker connections and result backend client, used inside the block, are
    closed on the way out, not dropped open for the garbage collector (old: left open,
    a ResourceWarning at whatever moment the collector ran: an example project's
    ``filterwarnings = error`` run failed now and then)."""
    app = App("kit-closes", set_as_current=False)
    app.config_from_object("celeryconfig")
    try:
        with real_worker(app, broker_url=BROKER, store_url=STORE):
            broker = app.pool.acquire(block=True)
            broker.ensure_connection(max_retries=1)
            broker.release()
            client = app.backend.client
            client.ping()
            results = client.connection_pool
        assert not broker.connected
        opened = [*results._available_connections, *results._in_use_connections]
        assert opened and all(c._sock is None for c in opened)
    finally:
        app.close()
