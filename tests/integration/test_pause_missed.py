"""A pause or a resume that misses a worker: its reply came after the operator stopped
waiting, or it never got the broadcast (starting, reconnecting). The resume must reach
it all the same, and a pause it missed must stop it: the worker reads the pause
documents of its own queues every few seconds (``conventions.worker.queue_pauses``)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

import pytest

from conventions.ops import pauses
from tasks import app
from tests.fixtures import WorkerProcess
from tests.integration import support_jobs
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.usefixtures("clean_store"), pytest.mark.timeout(180)]


def _logged(worker: WorkerProcess, line: str, after: int = 0) -> bool:
    return line in worker.output()[after:]


def test_a_worker_whose_pause_reply_came_late_takes_the_queue_again_on_resume(
    worker_process: Callable[..., WorkerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a reply missed the 1 s wait and the worker was left out of the pause
    document; the resume, sent to those in it only, never reached it. Here no reply can
    come in time (1 ms)."""
    worker = worker_process("late-reply", "email,heavy", concurrency=1)
    hostname = f"late-reply@{socket.gethostname()}"
    monkeypatch.setattr(pauses, "REPLY_TIMEOUT", 0.001)
    document = pauses.pause(app, "email", actor="olivia@ops", reason="provider outage")
    try:
        wait_for(lambda: _logged(worker, "Canceling queue email"), timeout=30)
        # its reply came too late; but its own look at the pause records (every few
        # seconds) may have stopped it first and joined it to the document while the
        # broadcast went out (a loaded machine's broadcast takes that long): the document
        # is made to leave it out, as a late reply did
        if _logged(worker, "queue email is paused (by"):
            wait_for(lambda: hostname in (pauses.QUEUES.get(app.store, "email") or {})
                     .get("workers", []))  # fmt: skip
        pauses.QUEUES.keep(app.store, "email", {**document, "workers": []})
        result = support_jobs.echo.delay(call_id=f"late-{uuid.uuid4().hex[:8]}")
        support_jobs.worker_had_its_chance()  # it fetches, but not from email
        assert result.state == "PENDING"
    finally:
        pauses.resume(app, "email", actor="olivia@ops")
    assert result.get(timeout=30)["call_id"].startswith("late-")
    assert "queue email resumed: consuming it again" in worker.output()


def test_a_worker_that_missed_the_broadcasts_follows_the_pause_document(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    """The pause document written, then removed, with no broadcast at all: the worker's
    next look stops the queue, and the one after the removal takes it again."""
    worker = worker_process("no-broadcast", "email,heavy", concurrency=1)
    hostname = f"no-broadcast@{socket.gethostname()}"
    paused_by = {"queue": "email", "actor": "olivia@ops", "at": "-", "reason": "outage"}
    app.store.put_state(pauses.QUEUES.record("email"), {**paused_by, "workers": []}, None)
    try:
        wait_for(lambda: _logged(worker, "queue email is paused (by olivia@ops"), timeout=30)
        wait_for(lambda: _logged(worker, "Canceling queue email"), timeout=30)
        stored = app.store.get_state(pauses.QUEUES.record("email"))
        assert stored is not None and stored["workers"] == [hostname]
        result = support_jobs.echo.delay(call_id=f"missed-{uuid.uuid4().hex[:8]}")
        support_jobs.worker_had_its_chance()  # it fetches, but not from email
        assert result.state == "PENDING"
    finally:
        app.store.delete_state(pauses.QUEUES.record("email"))
    wait_for(lambda: _logged(worker, "queue email is no longer paused"), timeout=30)
    assert result.get(timeout=30)["call_id"].startswith("missed-")
