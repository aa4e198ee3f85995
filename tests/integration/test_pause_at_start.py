"""A queue paused from the console stays paused for a worker that starts afterwards (a
deploy, a scale-up): the worker reads the pause when it is ready, does not take from the
queue, says so in its log, and joins the pause's workers, so the resume reaches it."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable

import pytest

from conventions.observability import queues
from conventions.ops import pauses
from tasks import app
from tests.fixtures import WorkerProcess
from tests.integration import support_jobs

pytestmark = [pytest.mark.usefixtures("clean_store"), pytest.mark.timeout(120)]


def _until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_worker_started_while_its_queue_is_paused_takes_nothing_until_resumed(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    paused_by = {"queue": "email", "actor": "olivia@ops", "at": "-", "reason": "outage"}
    app.store.put_state(pauses.QUEUES.record("email"), {**paused_by, "workers": []}, None)
    try:
        worker = worker_process("late-joiner", "email,heavy", concurrency=1)
        hostname = f"late-joiner@{socket.gethostname()}"
        _until(lambda: "queue email is paused (by olivia@ops" in worker.output(), "its log")
        _until(lambda: queues.consumers(app, 1.0).get("email", 0) == 0, "the cancel")
        result = support_jobs.echo.delay(call_id=f"paused-{uuid.uuid4().hex[:8]}")
        support_jobs.worker_had_its_chance()  # it fetches, but not from email
        assert result.state == "PENDING"
        stored = app.store.get_state(pauses.QUEUES.record("email"))
        assert stored is not None and stored["workers"] == [hostname]
    finally:
        answered = pauses.resume(app, "email", actor="olivia@ops").workers
    assert answered == [hostname]
    assert result.get(timeout=30)["call_id"].startswith("paused-")
