"""A rolling deploy across a message-format change, with real ``celery`` worker
processes: a worker of this release refuses the next release's message as
``newer_format`` (nothing runs), and once the fleet runs the next release, the dead
letter's replay runs on one of its workers. The next release is this tree with
``formats.HEADERS`` one higher (``support_next_release``, imported by the new worker;
set in this process for the publisher and the replay).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from conventions.config import formats
from conventions.ops.replay import replay
from conventions.store.records import Category
from tasks import app
from tests.fixtures import WorkerProcess
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

NEXT = "tests.integration.support_jobs,tests.acceptance.support_next_release"


@pytest.mark.timeout(300)
def test_an_old_worker_refuses_the_next_releases_message_and_a_new_worker_runs_its_replay(
    worker_process: Callable[..., WorkerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = worker_process("old", "email", concurrency=1)
    newer = formats.HEADERS + 1
    monkeypatch.setattr(formats, "HEADERS", newer)  # this process publishes as the next release
    call_id = f"roll_{uuid.uuid4().hex[:8]}"
    sent = support_jobs.echo.delay(call_id=call_id)
    record = wait_for(lambda: dead_letter_of(str(sent.id)), timeout=90)
    assert record.category is Category.NEWER_FORMAT
    assert f"message format version {newer} was written by a newer release" in record.message
    assert f"this worker reads up to {newer - 1}" in record.message
    assert record.worker.startswith("old@")
    wait_for(lambda: sent.state == "FAILURE", timeout=30)  # the caller's answer
    old.stop()
    assert f"[{sent.id}] received" not in old.output()  # refused before Celery saw it
    assert f"[{sent.id}] succeeded" not in old.output()

    new = worker_process("new", "email", concurrency=1, include=NEXT)
    again = replay(app, record.id, reason="fleet runs the next release", actor="test")
    assert again.deduplicated is False
    assert again.get(timeout=90)["call_id"] == call_id
    assert f"[{again.id}] received" in new.output()  # the only worker left: the new one
