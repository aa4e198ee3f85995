"""The console's runs pages against real Redis and a real (in-process) worker, served
by uvicorn: running now with progress, stuck runs, recent runs with filters, and a run's
page with its attempts, errors, logs and children."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import uvicorn

from conventions.console import console_app
from conventions.contrib.polling import trigger
from conventions.observability import audit, progress
from conventions.store.runs import Run
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration import support_capacity as cap
from tests.integration import support_runs  # registers testing.runs_retry.v1
from tests.integration.helpers import wait_for
from tests.integration.test_console import SECRET, by_headers, client
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("thread_worker", "clean_store")


@pytest.fixture(scope="module")
def base_url(services: None) -> Iterator[str]:
    """The console of the reference app, served by a real uvicorn in a thread."""
    port = free_port()
    web = console_app(app, authorizer=by_headers, secret=SECRET)
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=10)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def final(task_id: str) -> Run:
    def find() -> Run | None:
        run = app.store.get_run(task_id)
        return run if run is not None and not run.live else None

    return wait_for(find, timeout=20)


def test_a_retried_run_is_listed_and_its_page_shows_both_attempts_and_its_logs(
    base_url: str,
) -> None:
    item = uuid.uuid4().hex[:8]
    job = support_runs.runs_retry.delay(item_id=item)
    final(job.id)
    with client(base_url, "ann", "read-only") as http:
        page = http.get("/runs", params={"task": "testing.runs_retry.v1", "state": "succeeded"})
        assert page.status_code == 200
        assert f'href="/runs/{job.id}"' in page.text and 'aria-current="page">Runs' in page.text
        other = http.get("/runs", params={"state": "dead_lettered"})
        assert job.id not in other.text and "No runs match these filters" in other.text
        run = http.get(f"/runs/{job.id}")
        assert run.status_code == 200
        text = run.text
        assert "TransientError: the provider timed out" in text
        assert ">retried<" in text and ">succeeded<" in text
        assert f"attempt 2 of item {item}" in text


def test_a_running_run_shows_its_progress_now_and_in_the_json(base_url: str) -> None:
    export_id = f"e{uuid.uuid4().hex[:6]}"
    run_id = trigger(cap.export, export_id=export_id)
    try:
        wait_for(lambda: progress.read_progress(app.store, run_id), timeout=20)
        with client(base_url, "ann") as http:
            shown = wait_for(lambda: f'data-run="{run_id}"' in http.get("/runs").text, timeout=10)
            assert shown
            live = http.get("/runs.json").json()
            mine = next(r for r in live["running"] if r["id"] == run_id)
            assert mine["task"] == "testing.export.v1" and mine["progress"]["total"] == 3
    finally:
        for step in (1, 2, 3):
            app.store.put_state(f"testing:go:{export_id}:{step}", {"go": True}, 60)
    assert final(run_id).state == "succeeded"


def test_a_run_without_a_live_lease_is_stuck_and_its_children_are_listed(base_url: str) -> None:
    parent, child = f"p-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    correlation = f"corr-{uuid.uuid4().hex[:8]}"
    task = "testing.export.v1"
    head = {hdr.CORRELATION: correlation, hdr.IDEMPOTENCY_KEY: f"export:{parent}"}
    for name, attempt in (("published", 0), ("started", 1)):
        audit.record(app.store, name, task, parent, head, attempt=attempt)
    kid = {**head, hdr.CAUSATION: f"job:{parent}", hdr.IDEMPOTENCY_KEY: f"export:{child}"}
    audit.record(app.store, "published", task, child, kid)
    with client(base_url, "ann") as http:
        page = http.get("/runs").text
        assert 'id="stuck"' in page and "its ledger lease has lapsed" in page
        run = http.get(f"/runs/{parent}").text
        assert "Stuck: its ledger lease has lapsed" in run
        assert f'href="/runs/{child}"' in run
        assert http.get(f"/runs/{child}").text.count(f"job:{parent}") >= 1


def test_runs_pages_refuse_whom_the_authorizer_refuses_and_404_an_unknown_run(
    base_url: str,
) -> None:
    with client(base_url, None) as anonymous:
        for path in ("/runs", "/runs.json", "/runs/x"):
            assert anonymous.get(path).status_code == 403, path
    with client(base_url, "ann") as http:
        assert http.get("/runs/nope").status_code == 404
        assert http.get("/runs", params={"since": "yesterday"}).status_code == 400
        assert http.get("/runs", params={"state": "exploded"}).status_code == 400


def test_a_dead_letter_and_a_trace_link_to_the_run(base_url: str) -> None:
    job = support_runs.runs_retry.delay(item_id=uuid.uuid4().hex[:8], refuse=True)
    run = final(job.id)
    with client(base_url, "ann") as http:
        assert f'href="/runs/{job.id}"' in http.get(f"/dead-letters/{run.dead_letter_id}").text
        trace = http.get("/trace", params={"correlation": run.correlation_id}).text
        assert f'href="/runs/{job.id}"' in trace
        page = http.get(f"/runs/{job.id}").text
        assert f'href="/dead-letters/{run.dead_letter_id}"' in page and ">permanent<" in page
