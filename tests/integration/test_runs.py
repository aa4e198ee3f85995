"""Trigger-and-poll: a run id at once, then state and progress read while it runs."""

from __future__ import annotations

import datetime as dt
import warnings
from typing import Any

import pytest

from conventions.contrib.polling import progress_name, run_state, trigger
from tasks import app
from tests.integration import support_capacity as cap
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")


def test_a_triggered_run_reports_its_progress_then_its_result(thread_worker: Any) -> None:
    run_id = trigger(cap.export, export_id="e1")
    assert run_state(app, run_id).state in ("queued", "running")
    for step in (1, 2):
        seen = wait_for(lambda step=step: _at(run_id, step), timeout=20)
        assert seen.state == "running" and seen.progress == {"done": step, "total": 3}
        app.store.put_state(f"testing:go:e1:{step}", {"go": True}, 60)
    app.store.put_state("testing:go:e1:3", {"go": True}, 60)
    final = wait_for(lambda: (s := run_state(app, run_id)).finished and s, timeout=20)
    assert final.as_dict() == {
        "run_id": run_id, "state": "succeeded", "progress": {"done": 3, "total": 3},
        "result": {"rows": 3}, "error": None,
    }  # fmt: skip


def test_a_run_that_starts_between_the_polls_two_reads_shows_running(
    thread_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_state`` reads Celery's state, then the progress document: a job that starts
    between the two reads showed ``queued`` next to its body's progress (1 of 3 clean-clone
    runs of the test above). Here it starts there every time: it is due in 2 s, so the
    state read finds it queued, and the progress read waits for its first progress."""
    run_id = str(cap.export.apply_async(kwargs={"export_id": "e3"}, countdown=2).id)
    store = app.store
    read = store.get_state
    waited: list[str] = []

    def progress_once_started(name: str) -> Any:
        if name == progress_name(run_id) and not waited:
            waited.append(name)
            wait_for(lambda: read(name), timeout=30)  # the job starts in between
        return read(name)

    monkeypatch.setattr(store, "get_state", progress_once_started)
    seen = run_state(app, run_id)
    monkeypatch.undo()
    for step in (1, 2, 3):  # before asserting: a failure leaves no job waiting for it
        app.store.put_state(f"testing:go:e3:{step}", {"go": True}, 60)
    assert waited
    assert (seen.state, seen.progress) == ("running", {"done": 1, "total": 3})
    assert wait_for(lambda: run_state(app, run_id).finished, timeout=20)


def test_a_run_that_reports_with_ctx_progress_shows_running(thread_worker: Any) -> None:
    """``ctx.progress`` writes Celery's ``PROGRESS`` state: a poll shows it as running."""
    run_id = trigger(cap.reported_export, export_id="e4")
    seen = wait_for(lambda: (s := run_state(app, run_id)).progress and s, timeout=20)
    for step in (1, 2):
        app.store.put_state(f"testing:go:e4:{step}", {"go": True}, 60)
    assert seen.state == "running" and seen.progress is not None
    assert (seen.progress["done"], seen.progress["total"]) == (1, 2)
    final = wait_for(lambda: (s := run_state(app, run_id)).finished and s, timeout=20)
    assert (final.state, final.result) == ("succeeded", {"rows": 2})


def test_a_double_click_follows_the_same_run(thread_worker: Any) -> None:
    first = trigger(cap.export, export_id="e2")
    assert trigger(cap.export, export_id="e2") == first
    for step in (1, 2, 3):
        app.store.put_state(f"testing:go:e2:{step}", {"go": True}, 60)
    assert wait_for(lambda: run_state(app, first).finished, timeout=20)


def test_the_fastapi_example_answers_202_with_a_run_id_and_polls_it(
    thread_worker: Any,
) -> None:
    with warnings.catch_warnings():  # starlette asks for httpx2 at import: not ours to fix
        warnings.simplefilter("ignore")
        from fastapi import testclient

    from examples.fastapi_runs import api

    client = testclient.TestClient(api)
    started = client.post(f"/reports/daily-sales/{dt.date(2026, 1, 3)}")
    assert started.status_code == 202
    poll = started.json()["poll"]
    body = wait_for(lambda: (r := client.get(poll).json())["state"] == "succeeded" and r, 60)
    assert body["result"]["orders"] >= 0 and body["error"] is None


def _at(run_id: str, step: int) -> Any:
    state = run_state(app, run_id)
    return state if state.progress and state.progress["done"] == step else None
