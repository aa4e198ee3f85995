"""The console to operator level, against real Redis and a real (in-process) worker,
served by uvicorn: the queues' charts from the store's per-minute samples, the dead
letters paged, searched by payload id and either key form and discarded, a replay's
POST/redirect/GET and who replayed, a succeeded job re-run (refused while the ledger
holds its key unless forced), the schedules' cadence and banners, and the CLI's
``runs rerun`` and ``queues pause``/``resume``."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import uvicorn

from conventions.cli.main import main
from conventions.console import console_app
from conventions.console.pages import schedules as schedule_pages
from conventions.observability import audit
from conventions.ops import pauses, sampler
from conventions.schedules import beat
from conventions.schedules import entries as schedules
from conventions.store import series
from conventions.store.records import Category, DeadLetter
from conventions.store.runs import Run
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration import support_flaky, support_jobs, support_rabbit
from tests.integration.helpers import wait_for
from tests.integration.test_console import SECRET, by_headers, client, token_of
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("thread_worker", "clean_store")
APPLY = "payments.apply_event.v1"


@pytest.fixture(scope="module")
def base_url(services: None) -> Iterator[str]:
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


def payment_dead_letters(count: int) -> list[DeadLetter]:
    """``count`` dead letters of the payments task, a minute apart, written as a worker
    writes them (keys in the store's namespaced form)."""
    now = datetime.now(UTC)
    records = []
    for i in range(count):
        at = now - timedelta(minutes=count - i)
        key = f"payments.apply_event:payment-event:evt_{i}"
        record = DeadLetter(
            id=uuid.uuid4().hex, task=APPLY, task_id=uuid.uuid4().hex,
            category=Category.PERMANENT, payload={"event_id": f"evt_{i}"}, headers={},
            idempotency_key=key, exc_type="UnknownEvent", message=f"unknown event evt_{i}",
            traceback="", attempts=1, first_failed_at=at, last_failed_at=at, worker="w",
            queue="email", correlation_id=uuid.uuid4().hex,
        )  # fmt: skip
        app.store.put_dead_letter(record)
        records.append(record)
    return records


def rows_of(html: str) -> list[str]:
    return re.findall(r'<tr data-record="([0-9a-f]+)">', html)


def test_the_queues_page_opens_on_charts_of_the_stores_per_minute_samples(base_url: str) -> None:
    now = series.minute(datetime.now(UTC))
    for back, done in ((3, 10), (2, 25), (1, 40)):
        at = now - timedelta(minutes=back)
        row = {"published": done, "succeeded": done, "failed": 1, "retried": 2, "oldest": 4.0}
        series.record(app.store, at, {"email": row})
    sampler._last.clear()  # this process may have sampled this minute before the store was cleared
    with client(base_url, "rita") as http:
        page = http.get("/queues")
        assert page.status_code == 200
        assert page.text.count('<svg class="chart"') == 4
        processed = re.search(r'data-chart="succeeded".*?</svg>', page.text, re.S)
        assert processed and 'data-queue="email"' in processed.group(0)
        assert "30 in all" in page.text  # 10 -> 25 -> 40
        assert http.get("/queues?range=day").status_code == 200
        assert http.get("/queues?range=week").status_code == 400
        fragment = http.get("/queues/charts?range=hour")
        assert fragment.status_code == 200 and "<html" not in fragment.text
    # the page took the sample of the minute it rendered in (the clock may have passed a
    # minute's boundary since ``now``: then that later minute's)
    after = series.minute(datetime.now(UTC))
    assert any(series.has(app.store, minute) for minute in {now, after}), (now, after)


def test_the_sampler_keeps_each_queues_totals_and_oldest_age_once_a_minute() -> None:
    job = support_jobs.echo.delay(call_id=f"c{uuid.uuid4().hex[:8]}")
    job.get(timeout=20)
    final(job.id)
    sampler._last.clear()
    at = datetime.now(UTC)
    assert sampler.sample(app, now=at) is True
    assert sampler.sample(app, now=at) is False  # once a minute, whoever calls
    ((_, queues),) = series.read(app.store, at, at)
    assert queues["email"]["succeeded"] >= 1 and queues["email"]["published"] >= 1
    assert "oldest" in queues["heavy"]


def test_dead_letters_are_paged_counted_sorted_and_found_by_payload_id_or_either_key_form(
    base_url: str,
) -> None:
    records = payment_dead_letters(55)
    with client(base_url, "rita") as http:
        first = http.get("/dead-letters")
        assert '<small class="hint" id="count">55' in first.text
        assert "page 1 of 2" in first.text and len(rows_of(first.text)) == 50
        assert rows_of(first.text)[0] == records[-1].id  # newest first
        second = http.get("/dead-letters?page=2")
        assert len(rows_of(second.text)) == 5
        oldest = http.get("/dead-letters?sort=oldest")
        assert rows_of(oldest.text)[0] == records[0].id
        for search in ("q=evt_7", "key=payment-event:evt_7",
                       "key=payments.apply_event:payment-event:evt_7",
                       "q=payment-event:evt_7"):  # fmt: skip
            found = http.get(f"/dead-letters?{search}")
            assert rows_of(found.text) == [records[7].id], search
        assert "UnknownEvent: unknown event evt_54" in first.text  # the message column
        assert http.get("/dead-letters?page=x").status_code == 400


def test_a_selection_of_dead_letters_is_discarded_with_a_reason_and_each_is_audited(
    base_url: str,
) -> None:
    records = payment_dead_letters(3)
    chosen = [records[0].id, records[1].id]
    with client(base_url, "rita", "read-only") as http:
        token = token_of(http, "/dead-letters")
        form = {"id": chosen, "reason": "test orders", "csrf_token": token}
        assert http.post("/dead-letters/discard", data=form).status_code == 403
    with client(base_url, "olivia@ops", "operator") as http:
        token = token_of(http, "/dead-letters")
        blank = {"id": chosen, "reason": " ", "csrf_token": token}
        assert http.post("/dead-letters/discard", data=blank).status_code == 400
        form = {"id": chosen, "reason": "test orders", "csrf_token": token}
        done = http.post("/dead-letters/discard", data=form)
        assert done.status_code == 200 and done.history[0].status_code == 303
        assert "2 discarded" in done.text
    assert [app.store.get_dead_letter(i) for i in chosen] == [None, None]
    assert app.store.get_dead_letter(records[2].id) is not None
    for record in records[:2]:
        assert record.correlation_id
        (event,) = [e for e in app.store.audit_for(record.correlation_id) if e.event == "discarded"]
        assert event.detail["actor"] == "olivia@ops" and event.detail["reason"] == "test orders"
        assert event.detail["dead_letter_id"] == record.id


def test_a_replay_redirects_to_its_outcome_and_the_record_says_who_why_and_the_new_job(
    base_url: str,
) -> None:
    item = f"item{uuid.uuid4().hex[:8]}"
    with support_flaky.flags() as flags:
        flags.set(support_flaky.broken_flag(item), "1", ex=300)
    failed = support_flaky.flaky.delay(item_id=item)
    record = wait_for(
        lambda: next(
            (r for r in app.store.list_dead_letters(task="testing.flaky.v1", limit=100)
             if r.task_id == failed.id), None,
        ), timeout=20,
    )  # fmt: skip
    with support_flaky.flags() as flags:
        flags.delete(support_flaky.broken_flag(item))
    with client(base_url, "olivia@ops", "operator") as http:
        token = token_of(http, f"/dead-letters/{record.id}")
        form = {"id": record.id, "reason": "provider fixed", "csrf_token": token}
        answer = http.post("/dead-letters/replay", data=form, follow_redirects=False)
        assert answer.status_code == 303
        outcome = answer.headers["location"]
        assert outcome.startswith("/dead-letters/replays/")
        for _ in range(2):  # a reload shows the outcome again and replays nothing
            assert http.get(outcome).status_code == 200
        assert record.correlation_id
        replays = [e for e in app.store.audit_for(record.correlation_id) if e.event == "replayed"]
        assert len(replays) == 1
        page = http.get(f"/dead-letters/{record.id}").text
        assert 'id="replays"' in page and "olivia@ops" in page and "provider fixed" in page
        assert f'href="/runs/{replays[0].task_id}"' in page
        assert ">Replay</button>" not in page  # an operator is offered no second replay
        assert "provider refuses item" in page  # the cause, as the exception said it


def test_an_admin_reruns_a_succeeded_job_only_with_force_while_the_ledger_holds_its_key(
    base_url: str,
) -> None:
    job = support_jobs.echo.delay(call_id=f"c{uuid.uuid4().hex[:8]}")
    job.get(timeout=20)
    assert final(job.id).state == "succeeded"
    with client(base_url, "olivia@ops", "operator") as http:
        page = http.get(f"/runs/{job.id}").text
        assert 'action="/runs/rerun"' not in page
        token = token_of(http, "/queues")
        form = {"task_id": job.id, "reason": "again", "csrf_token": token}
        assert http.post("/runs/rerun", data=form).status_code == 403
    with client(base_url, "ada", "admin") as http:
        token = token_of(http, f"/runs/{job.id}")
        form = {"task_id": job.id, "reason": "customer asked", "csrf_token": token}
        refused = http.post("/runs/rerun", data=form)
        assert refused.status_code == 409 and "ledger still holds" in refused.text
        forced = http.post("/runs/rerun", data={**form, "force": "1"}, follow_redirects=False)
        assert forced.status_code == 303
        new_id = forced.headers["location"].removeprefix("/runs/")
    again = final(new_id)
    assert again.state == "succeeded" and again.replay_of == job.id and again.replayed_by == "ada"
    events = app.store.audit_for(str(again.correlation_id))
    assert {e.event for e in events} >= {"key_cleared", "replayed"}
    replayed = next(e for e in events if e.event == "replayed")
    assert replayed.detail["reason"] == "customer asked" and replayed.detail["forced"] is True


def test_the_cli_reruns_a_succeeded_job_only_with_force(capsys: pytest.CaptureFixture[str]) -> None:
    job = support_jobs.echo.delay(call_id=f"c{uuid.uuid4().hex[:8]}")
    job.get(timeout=20)
    final(job.id)
    assert main(["-A", "tasks", "runs", "rerun", job.id, "--reason", "again"]) == 1
    assert "ledger still holds" in capsys.readouterr().err
    assert main(["-A", "tasks", "runs", "rerun", job.id, "--reason", " "]) == 2
    code = main(["-A", "tasks", "runs", "rerun", job.id, "--reason", "again", "--force"])
    out = capsys.readouterr().out
    assert code == 0, out
    new_id = out.strip().rsplit("job ", 1)[1].split()[0]
    assert final(new_id).state == "succeeded"


def test_a_queue_paused_from_the_cli_shows_on_the_schedules_page_until_resumed(
    base_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-A", "tasks", "queues", "pause", "nosuch", "--reason", "x"]) == 1
    assert main(["-A", "tasks", "queues", "pause", "heavy", "--reason", "db migration"]) == 0
    try:
        assert "heavy paused by" in capsys.readouterr().out
        held = pauses.QUEUES.get(app.store, "heavy")
        assert held is not None and held["reason"] == "db migration" and held["workers"]
        with client(base_url, "rita") as http:
            page = http.get("/schedules").text
        banner = re.search(r'id="no-consumer".*?</p>', page, re.S)
        assert banner and "heavy" in banner.group(0) and "daily-sales" in banner.group(0)
    finally:
        assert main(["-A", "tasks", "queues", "resume", "heavy"]) == 0
    assert "take from it again" in capsys.readouterr().out
    assert pauses.QUEUES.get(app.store, "heavy") is None


def test_a_pause_whose_broadcast_finds_no_broker_is_kept_audited_and_said(
    clean_store: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """#48: with the broker down, ``queues pause`` exited 3 saying nothing answered, yet
    the record it had kept paused the queue, unaudited. The record is what every worker
    follows, so the pause (and the resume) stand, are audited, and say the broadcast
    was not sent."""
    down = support_rabbit.unreachable  # its broker: nothing listens on port 1
    target = "tests.integration.support_rabbit:unreachable"
    queue = support_rabbit.VIEW

    assert main(["-A", target, "queues", "pause", queue, "--reason", "broker down"]) == 0
    said = capsys.readouterr()
    assert f"{queue} paused by" in said.out
    assert "the broadcast was not sent: the broker did not answer" in said.err
    held = pauses.QUEUES.get(down.store, queue)
    assert held is not None and held["reason"] == "broker down"
    assert main(["-A", target, "queues", "resume", queue]) == 0
    said = capsys.readouterr()
    assert f"{queue} resumed by" in said.out and "was not sent" in said.err
    assert pauses.QUEUES.get(down.store, queue) is None
    trail = down.store.audit_for(pauses.QUEUES.correlation(queue))
    events = {event.event: event.detail for event in trail}
    assert set(events) == {"queue_paused", "queue_resumed"}, trail
    assert all("not sent" in detail["broadcast"] for detail in events.values())


def test_the_schedules_page_says_the_cadence_the_next_run_and_that_beat_looks_down(
    base_url: str,
) -> None:
    # daily-sales' latest occurrence unsent: a beat another test runs sends it for real
    # when its time (20:00 UTC) comes during the suite, and the store keeps that record
    schedules.use_clock(app.conf)
    entry = next(e for e in schedules.entries_of(app) if e.name == "daily-sales")
    current = schedules.now()
    latest = entry.schedule.latest(current)
    assert latest is not None
    app.store.delete_state(beat.sent_key(entry.occurrence(latest)))
    with client(base_url, "rita") as http:
        page = http.get("/schedules").text
    assert "daily at 03:00 Asia/Bangkok" in page and "every minute" in page
    assert re.search(r'class="num next-run">\d{4}-\d\d-\d\d \d\d:\d\d \+07', page)
    beat_down = re.search(r'id="beat-down".*?</p>', page, re.S)
    named = beat_down is not None and "daily-sales" in beat_down.group(0)
    late = [moment - latest >= schedule_pages.GRACE for moment in (current, schedules.now())]
    if late == [True, True]:
        assert named
    elif late == [False, False]:  # due under GRACE (2 minutes) ago: not late yet
        assert not named
    assert 'id="no-consumer"' not in page  # the thread worker consumes email and heavy


def test_runs_are_paged_counted_and_found_by_payload_id_or_either_key_form(base_url: str) -> None:
    task, story = "testing.echo.v1", uuid.uuid4().hex
    ids = [uuid.uuid4().hex for _ in range(55)]
    for i, task_id in enumerate(ids):
        headers = {hdr.CORRELATION: story, hdr.IDEMPOTENCY_KEY: f"echo:c{i}"}
        audit.record(app.store, "published", task, task_id, headers)
    headers = {hdr.CORRELATION: story, hdr.IDEMPOTENCY_KEY: "echo:c7"}
    audit.record(app.store, "started", task, ids[7], headers, attempt=1)
    error = "TransientError: the provider timed out"
    detail = {"exc_type": "TransientError", "reason": "the provider timed out"}
    audit.record(app.store, "retried", task, ids[7], headers, attempt=1, detail=detail)
    with client(base_url, "rita") as http:
        first = http.get(f"/runs?task={task}")
        assert '<small class="hint" id="count">55' in first.text and "page 1 of 2" in first.text
        assert len(re.findall(r'<td class="mono"><a href="/runs/', first.text)) == 50
        for search in ("q=c7", "q=echo:c7", "key=echo:c7", "key=testing.echo:echo:c7"):
            found = http.get(f"/runs?{search}")
            listed = re.findall(r'<td class="mono"><a href="/runs/([0-9a-f]+)"', found.text)
            assert listed == [ids[7]], search
        assert error in http.get("/runs?q=c7").text  # the message column


def test_the_watchdogs_run_takes_the_minutes_sample_on_a_real_worker() -> None:
    """Beat runs the watchdog every minute: its run samples the queues, so the charts go
    on while nobody has the console open."""
    from conventions.schedules import watchdog

    sampler._last.clear()  # the worker shares this process's guard (a thread worker)
    at = datetime.now(UTC)
    job = app.tasks[watchdog.TASK].delay(checked_at=at.isoformat())
    job.get(timeout=20)
    assert wait_for(lambda: series.read(app.store, at, datetime.now(UTC)), timeout=10)
