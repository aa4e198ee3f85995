"""A worker's look at the pause documents of its own queues
(``conventions.worker.queue_pauses.Watch.look``, which a worker runs every few seconds;
called here on the in-process worker so that each look is one step of the test)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from conventions.ops import pauses
from conventions.worker import queue_pauses
from tasks import app
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")


def test_a_look_leaves_a_hand_cancel_alone_stops_a_paused_queue_and_takes_it_back(
    thread_worker: Any,
) -> None:
    consumer = thread_worker.consumer
    host = str(consumer.hostname)
    watch = queue_pauses.watch_of(app, host, consumer)
    assert {"email", "heavy"} <= watch.own
    try:
        # by hand (celery control cancel_consumer), no pause: not the watch's business
        app.control.cancel_consumer("email", destination=[host], reply=True, timeout=10)
        wait_for(lambda: "email" not in watch.consuming(), timeout=20)
        assert watch.look() == [] and watch.held == set()
        app.control.add_consumer("email", destination=[host], reply=True, timeout=10)
        wait_for(lambda: "email" in watch.consuming(), timeout=20)
        # a pause whose broadcast it missed: the document only
        paused_by = {"queue": "email", "actor": "olivia@ops", "at": "-", "reason": "outage"}
        app.store.put_state(pauses.QUEUES.record("email"), {**paused_by, "workers": []}, None)
        assert watch.look() == ["email"]
        wait_for(lambda: "email" not in watch.consuming(), timeout=20)
        stored = app.store.get_state(pauses.QUEUES.record("email"))
        assert stored is not None and stored["workers"] == [host]
        assert watch.look() == [] and watch.held == {"email"}  # still paused: nothing new
        # ... and the resume it missed: the document gone
        app.store.delete_state(pauses.QUEUES.record("email"))
        assert watch.look() == []
        wait_for(lambda: "email" in watch.consuming(), timeout=20)
        assert watch.held == set()
    finally:
        app.store.delete_state(pauses.QUEUES.record("email"))
        app.control.add_consumer("email", destination=[host], reply=True, timeout=10)


def test_a_resume_reaches_a_worker_left_out_of_the_pause_document(
    thread_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume is broadcast: a worker that holds the queue paused consumes it again,
    listed or not; one that does not hold it says so."""
    consumer = thread_worker.consumer
    host = str(consumer.hostname)
    watch = queue_pauses.watch_of(app, host, consumer)
    app.control.cancel_consumer("email", destination=[host], reply=True, timeout=10)
    wait_for(lambda: "email" not in watch.consuming(), timeout=20)
    paused_by = {"queue": "email", "actor": "olivia@ops", "at": "-", "reason": "outage"}
    app.store.put_state(pauses.QUEUES.record("email"), {**paused_by, "workers": []}, None)
    try:
        with monkeypatch.context() as patched:  # its answer in time, even on a busy machine
            patched.setattr(pauses, "REPLY_TIMEOUT", 5.0)
            assert pauses.resume(app, "email", actor="olivia@ops").workers == [host]
        wait_for(lambda: "email" in watch.consuming(), timeout=20)
        assert pauses.resume(app, "email", actor="olivia@ops").workers == []  # consuming it
    finally:
        app.control.add_consumer("email", destination=[host], reply=True, timeout=10)
    trail = app.store.audit_for("queue:email")
    assert [e.detail["workers"] for e in trail if e.event == "queue_resumed"] == [[host], []]


def test_a_look_reads_the_pause_documents_of_every_own_queue_in_one_command(
    clean_store: redis.Redis,
) -> None:
    """An idle worker looks every few seconds: one ``MGET`` whatever its queues, not a
    ``GET`` per queue (the idle cost grew with the queues); a paused one is still seen."""
    names = [f"q{n}" for n in range(5)]
    paused_by = {"actor": "olivia@ops", "at": "-", "reason": "outage", "workers": []}
    for name in ("q1", "q3"):
        app.store.put_state(pauses.QUEUES.record(name), {"queue": name, **paused_by}, None)
    pauses.QUEUES.get_many(app.store, names)  # the store's client connected

    def sent() -> dict[str, int]:
        stats = clean_store.info("commandstats")
        return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
                for name in ("get", "mget")}  # fmt: skip

    before = sent()
    found = pauses.QUEUES.get_many(app.store, names)
    after = sent()
    assert sorted(found) == ["q1", "q3"] and found["q3"]["queue"] == "q3"
    assert (after["get"] - before["get"], after["mget"] - before["mget"]) == (0, 1)
