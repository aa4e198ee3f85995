"""Run history with a real worker on Redis, and ``conventions runs``.

A job retried once then succeeding is one run with two attempts (each with its worker,
times and outcome, the error scrubbed) and its log lines; a dead-lettered job's run is
``dead_lettered`` with its category and dead-letter id; the CLI lists and shows them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import pytest

from conventions import bind
from conventions.cli.main import main
from conventions.store.runs import Run
from tasks import app
from tests.integration import support_runs  # registers testing.runs_retry.v1

pytestmark = pytest.mark.usefixtures("thread_worker", "clean_store")
T = TypeVar("T")
TASK = "testing.runs_retry.v1"


def eventually(find: Callable[[], T | None], what: str, timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def final_run(task_id: str) -> Run:
    def find() -> Run | None:
        run = app.store.get_run(task_id)
        return run if run is not None and not run.live else None

    return eventually(find, f"the final run of {task_id}")


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["-A", "tasks", *argv])
    return code, capsys.readouterr().out


def test_a_retry_then_success_is_one_run_with_two_attempts() -> None:
    item, correlation = uuid.uuid4().hex[:8], f"corr-{uuid.uuid4().hex[:8]}"
    with bind(correlation_id=correlation):
        job = support_runs.runs_retry.delay(item_id=item)
    assert job.get(timeout=20) == "ok"
    run = final_run(job.id)
    assert (run.state, run.task, run.key, run.correlation_id) == (
        "succeeded", TASK, f"runs-retry:{item}", correlation,
    )  # fmt: skip
    assert run.queue == "email"
    assert [(a.n, a.outcome) for a in run.attempts] == [(1, "retried"), (2, "succeeded")]
    assert all(a.worker and a.started_at and a.ended_at for a in run.attempts)
    assert run.attempts[0].error == "TransientError: the provider timed out"
    ours = [line.rsplit(": ", 1)[1] for line in run.logs if "tests.support_runs" in line]
    assert ours == [f"attempt 1 of item {item}", f"attempt 2 of item {item}"]
    assert any("retrying in" in line for line in run.logs)  # the layer's own lines too


def test_a_dead_letter_is_a_dead_lettered_run_with_its_category() -> None:
    job = support_runs.runs_retry.delay(item_id=uuid.uuid4().hex[:8], refuse=True)
    run = final_run(job.id)
    assert (run.state, run.category) == ("dead_lettered", "permanent")
    record = app.store.get_dead_letter(str(run.dead_letter_id))
    assert record is not None and record.task_id == job.id
    assert [a.outcome for a in run.attempts] == ["dead_lettered"]


def test_runs_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    item = uuid.uuid4().hex[:8]
    job = support_runs.runs_retry.delay(item_id=item)
    final_run(job.id)
    code, out = cli(["runs", "list", "--task", TASK, "--state", "succeeded", "--json"], capsys)
    assert code == 0
    assert [run["id"] for run in json.loads(out)] == [job.id]
    code, out = cli(["runs", "list", "--key", f"runs-retry:{item}"], capsys)
    assert code == 0 and job.id in out and "succeeded" in out
    code, out = cli(["runs", "list", "--state", "dead_lettered"], capsys)
    assert (code, out.strip()) == (0, "no runs")
    code, out = cli(["runs", "show", job.id], capsys)
    assert code == 0
    assert "#1 retried" in out and "#2 succeeded" in out and f"attempt 2 of item {item}" in out
    code, out = cli(["runs", "show", job.id, "--json"], capsys)
    assert json.loads(out)["version"] == "v1"


def test_runs_show_of_an_unknown_run_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-A", "tasks", "runs", "show", "nope"]) == 1
    assert "no run nope" in capsys.readouterr().err
