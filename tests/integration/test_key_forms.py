"""An idempotency key in either form, everywhere an operator types or reads one.

Dead letters and the store keep a key under its task's namespace
(``testing.declined:declined:call_1``); the body, the run history and the providers see
it bare (``declined:call_1``). Filtering dead letters by the bare key found nothing, runs
by the namespaced one neither, and ``keys show`` of a bare key printed "none / none" with
exit 0. Now every filter takes either form, both are shown (labelled), and a miss says
what it looked for and exits 1. Real Redis, a real (thread) worker, the console served by
uvicorn."""

from __future__ import annotations

import json
import uuid

import pytest

from conventions.cli.main import main
from conventions.store.records import DeadLetter
from conventions.store.runs import Run
from tasks import app
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, wait_for
from tests.integration.test_console import client
from tests.integration.test_console_runs import base_url  # noqa: F401  (the served console)

pytestmark = pytest.mark.usefixtures("thread_worker", "clean_store")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["-A", "tasks", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def finished(task_id: str) -> Run:
    def find() -> Run | None:
        run = app.store.get_run(task_id)
        return run if run is not None and not run.live else None

    return wait_for(find, timeout=30)


@pytest.fixture
def declined() -> tuple[DeadLetter, str, str]:
    """A dead letter, its key bare and namespaced."""
    call_id = f"call_{uuid.uuid4().hex[:10]}"
    handle = support_jobs.declined.delay(call_id=call_id)
    record = wait_for(lambda: dead_letter_of(handle.id))
    finished(handle.id)
    return record, f"declined:{call_id}", f"testing.declined:declined:{call_id}"


@pytest.fixture
def echoed() -> tuple[str, str, str]:
    """A job done (its key held in the ledger): its id, its key bare and namespaced."""
    call_id = f"call_{uuid.uuid4().hex[:10]}"
    handle = support_jobs.echo.delay(call_id=call_id)
    handle.get(timeout=30)
    finished(handle.id)
    return handle.id, f"echo:{call_id}", f"testing.echo:echo:{call_id}"


def test_keys_show_finds_a_bare_key_and_prints_both_forms(
    capsys: pytest.CaptureFixture[str], echoed: tuple[str, str, str]
) -> None:
    _, bare, stored = echoed

    code, out, err = cli(capsys, "keys", "show", bare)

    assert code == 0, err
    assert f"key          {bare}" in out and f"store key    {stored}" in out
    assert "succeeded" in out or "done" in out
    code, out, _ = cli(capsys, "keys", "show", stored, "--json")
    assert code == 0
    assert json.loads(out)["key"] == stored and json.loads(out)["body_key"] == bare


def test_keys_show_of_a_key_nothing_holds_says_what_it_looked_for_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = cli(capsys, "keys", "show", "charge:inv_4004")

    assert code == 1
    assert out == ""
    assert "nothing held for 'charge:inv_4004'" in err
    assert "testing.echo:charge:inv_4004" in err  # a namespace it looked under
    code, out, _ = cli(capsys, "keys", "show", "charge:inv_4004", "--json")
    assert code == 1 and "charge:inv_4004" in json.loads(out)["looked_for"]


def test_runs_list_finds_a_run_by_either_form_of_its_key(
    capsys: pytest.CaptureFixture[str], echoed: tuple[str, str, str]
) -> None:
    task_id, bare, stored = echoed

    for form in (bare, stored):
        code, out, err = cli(capsys, "runs", "list", "--key", form, "--json")
        assert code == 0, err
        assert [run["id"] for run in json.loads(out)] == [task_id], form
    code, out, _ = cli(capsys, "runs", "show", task_id)
    assert f"key          {bare}" in out and f"store key    {stored}" in out


def test_dlq_show_labels_both_forms_of_the_key(
    capsys: pytest.CaptureFixture[str], declined: tuple[DeadLetter, str, str]
) -> None:
    record, bare, stored = declined

    code, out, err = cli(capsys, "dlq", "show", record.id)

    assert code == 0, err
    lines = out.splitlines()
    assert any(line.startswith("idempotency key:") and line.endswith(f" {bare}") for line in lines)
    assert any(line.startswith("store key:") and line.endswith(f" {stored}") for line in lines)


def test_the_console_filters_dead_letters_and_runs_by_either_form_of_the_key(
    base_url: str,  # noqa: F811
    declined: tuple[DeadLetter, str, str],
) -> None:
    record, bare, stored = declined

    with client(base_url, "ann") as http:
        for form in (bare, stored):
            letters = http.get("/dead-letters", params={"key": form}).text
            assert record.id in letters, form
            runs = http.get("/runs", params={"key": form}).text
            assert f'href="/runs/{record.task_id}"' in runs, form
        page = http.get(f"/dead-letters/{record.id}").text
        assert f'<dd class="mono">{bare}</dd>' in page and f'<dd class="mono">{stored}</dd>' in page
        run = http.get(f"/runs/{record.task_id}").text
        assert f'<dd class="mono">{bare}</dd>' in run and f'<dd class="mono">{stored}</dd>' in run
