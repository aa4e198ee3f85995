"""The console against real Redis and a real (in-process) worker, served by uvicorn.

The host app's authorizer here reads two request headers (the actor and the role) that
stand for the host's own login; the forms are posted the way a browser posts them.
Dead letters come from the test-only ``testing.flaky.v1`` (its provider is "fixed"
between the failure and the replay) and the reference ``payments.apply_event.v1``
(declared ``replayable=False``).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn

from conventions import bind
from conventions.console import Principal, Role, console_app, csrf
from conventions.store.records import AuditEvent, DeadLetter
from tasks import app
from tasks.payments import apply_event
from tests.integration import support_flaky, support_jobs  # register their jobs before the worker
from tests.isolation import free_port

T = TypeVar("T")
WAIT = 20.0
SECRET = b"console-tests-secret"
TOKEN = re.compile(r'name="csrf_token" value="([0-9]+\.[0-9a-f]+)"')

pytestmark = pytest.mark.usefixtures("thread_worker", "clean_store")


def by_headers(request: Any) -> Principal | None:
    """The test host's login: ``x-test-actor`` and ``x-test-role``; no actor, no entry."""
    actor = request.headers.get("x-test-actor")
    return (
        Principal(actor, Role(request.headers.get("x-test-role", "read-only"))) if actor else None
    )


@pytest.fixture(scope="module")
def base_url(services: None) -> Iterator[str]:
    """The console of the reference app, served by a real uvicorn in a thread."""
    port = free_port()
    web = console_app(app, authorizer=by_headers, secret=SECRET)
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def client(base_url: str, actor: str | None, role: str = "read-only") -> httpx.Client:
    headers = {"x-test-actor": actor, "x-test-role": role} if actor else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=10, follow_redirects=True)


def eventually(find: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {WAIT:.0f}s waiting for {what}")


def dead_letter(task: str, task_id: str) -> DeadLetter:
    def find() -> DeadLetter | None:
        records = app.store.list_dead_letters(task=task, limit=1000)
        return next((r for r in records if r.task_id == task_id), None)

    return eventually(find, f"the dead letter of {task}[{task_id}]")


def audit_event(correlation_id: str, name: str, task_id: str) -> AuditEvent:
    def find() -> AuditEvent | None:
        events = app.store.audit_for(correlation_id)
        return next((e for e in events if e.event == name and e.task_id == task_id), None)

    return eventually(find, f"audit event {name!r} of job {task_id}")


def flaky_dead_letter() -> tuple[str, DeadLetter]:
    item = f"item{uuid.uuid4().hex[:8]}"
    with support_flaky.flags() as flags:
        flags.set(support_flaky.broken_flag(item), "1", ex=300)
    result = support_flaky.flaky.delay(item_id=item)
    return item, dead_letter("testing.flaky.v1", result.id)


def fix(item: str) -> None:
    with support_flaky.flags() as flags:
        flags.delete(support_flaky.broken_flag(item))


def token_of(http: httpx.Client, path: str) -> str:
    """Load ``path`` as a browser would (it sets the CSRF cookie) and read its form token."""
    page = http.get(path)
    assert page.status_code == 200, page.text
    found = TOKEN.search(page.text)
    assert found, f"no form with a CSRF token on {path}"
    return found.group(1)


def test_nothing_is_served_to_whom_the_authorizer_refuses(base_url: str) -> None:
    """Every route of the app, enumerated (a new route without its check fails here);
    the static files (the stylesheet and the script) are the only public mount."""
    from starlette.routing import Mount, Route

    web = console_app(app, authorizer=by_headers, secret=SECRET)
    checked = 0
    with client(base_url, None) as anonymous:
        for route in web.routes:
            if isinstance(route, Mount):
                assert route.path == "/static", f"a mount nobody checks: {route.path}"
                continue
            assert isinstance(route, Route), route
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            for method in sorted(route.methods or ()):
                answer = anonymous.request(method, path, data={"id": "x", "reason": "r"}
                                           if method == "POST" else None)  # fmt: skip
                assert answer.status_code == 403, (method, path, answer.status_code)
                checked += 1
    assert checked >= 16


def test_an_operator_replays_a_dead_letter_with_a_reason_and_the_audit_names_them(
    base_url: str,
) -> None:
    item, record = flaky_dead_letter()
    with client(base_url, "olivia@ops", "operator") as http:
        listed = http.get("/dead-letters", params={"task": "testing.flaky.v1"})
        assert record.id in listed.text
        token = token_of(http, f"/dead-letters/{record.id}")
        page = http.get(f"/dead-letters/{record.id}").text
        assert "provider refuses item" in page and ">Replay</button>" in page
        fix(item)
        missing_reason = http.post(
            "/dead-letters/replay", data={"id": record.id, "reason": " ", "csrf_token": token}
        )
        assert missing_reason.status_code == 400
        replayed = http.post(
            "/dead-letters/replay",
            data={"id": record.id, "reason": "provider fixed", "csrf_token": token},
        )
    assert replayed.status_code == 200, replayed.text
    linked = r'<td class="mono"><a href="/runs/[0-9a-f-]{36}">([0-9a-f-]{36})</a>'
    (new_id,) = re.findall(linked, replayed.text)
    assert record.correlation_id
    audit = audit_event(record.correlation_id, "replayed", new_id)
    assert audit.detail["actor"] == "olivia@ops"
    assert audit.detail["reason"] == "provider fixed"
    audit_event(record.correlation_id, "succeeded", new_id)
    stored = app.store.get_dead_letter(record.id)
    assert stored is not None and stored.replayed_at is not None


def test_a_read_only_user_sees_no_replay_and_a_forged_post_is_refused(base_url: str) -> None:
    _, record = flaky_dead_letter()
    with client(base_url, "rita", "read-only") as http:
        page = http.get(f"/dead-letters/{record.id}")
        assert page.status_code == 200
        assert ">Replay</button>" not in page.text
        assert 'action="/dead-letters/replay"' not in page.text
        nonce = http.cookies[csrf.COOKIE]
        forged = http.post(
            "/dead-letters/replay",
            data={"id": record.id, "reason": "me", "csrf_token": csrf.token(SECRET, nonce, "rita")},
        )
    assert forged.status_code == 403
    assert "read-only" in forged.text
    stored = app.store.get_dead_letter(record.id)
    assert stored is not None and stored.replayed_at is None


@pytest.mark.parametrize("token", ["", "0" * 64, "someone-else's"])
def test_a_post_without_its_csrf_token_is_refused(base_url: str, token: str) -> None:
    _, record = flaky_dead_letter()
    with client(base_url, "olivia@ops", "operator") as http:
        valid = token_of(http, f"/dead-letters/{record.id}")
        if token == "someone-else's":  # a token of another actor, with this cookie
            token = csrf.token(SECRET, http.cookies[csrf.COOKIE], "mallory")
        data = {"id": record.id, "reason": "r", **({"csrf_token": token} if token else {})}
        refused = http.post("/dead-letters/replay", data=data)
        assert valid != token
    assert refused.status_code == 403
    assert "CSRF" in refused.text
    stored = app.store.get_dead_letter(record.id)
    assert stored is not None and stored.replayed_at is None


def test_a_not_replayable_job_says_why_and_needs_an_admin_with_force(base_url: str) -> None:
    result = apply_event.delay(event_id=f"evt_missing_{uuid.uuid4().hex[:8]}")
    record = dead_letter("payments.apply_event.v1", result.id)
    with client(base_url, "olivia@ops", "operator") as http:
        page = http.get(f"/dead-letters/{record.id}")
        assert "declared replayable=False" in page.text
        assert 'name="reason"' not in page.text
        nonce_token = csrf.token(SECRET, http.cookies[csrf.COOKIE], "olivia@ops")
        plain = http.post(
            "/dead-letters/replay",
            data={"id": record.id, "reason": "r", "csrf_token": nonce_token},
        )
        assert plain.status_code == 409 and "replayable=False" in plain.text
        forced = http.post(
            "/dead-letters/replay",
            data={"id": record.id, "reason": "r", "force": "1", "csrf_token": nonce_token},
        )
        assert forced.status_code == 403
    with client(base_url, "ada", "admin") as http:
        token = token_of(http, f"/dead-letters/{record.id}")
        done = http.post(
            "/dead-letters/replay",
            data={
                "id": record.id,
                "reason": "checked the ledger",
                "force": "1",
                "csrf_token": token,
            },
        )
    assert done.status_code == 200, done.text
    assert record.correlation_id
    events = app.store.audit_for(record.correlation_id)
    (replayed,) = [e for e in events if e.event == "replayed"]
    assert replayed.detail["actor"] == "ada" and replayed.detail["forced"] is True


def test_the_trace_page_shows_a_correlation_ids_jobs(base_url: str) -> None:
    _, record = flaky_dead_letter()
    assert record.correlation_id
    with client(base_url, "rita") as http:
        page = http.get("/trace", params={"correlation": record.correlation_id})
        unknown = http.get("/trace", params={"correlation": "no-such-story"})
    assert page.status_code == 200
    assert record.task_id in page.text and "dead_lettered" in page.text
    assert unknown.status_code == 404


def test_a_schedule_trigger_sent_twice_sends_once_and_is_audited(base_url: str) -> None:
    with client(base_url, "olivia@ops", "operator") as http:
        assert "watchdog" in http.get("/schedules").text
        token = token_of(http, "/schedules")
        page = http.get("/schedules").text
        found = re.search(
            r'name="name" value="watchdog"><input type="hidden" name="at" value="([^"]+)"', page
        )
        assert found, "the trigger form names its occurrence"
        form = {"name": "watchdog", "at": found.group(1), "csrf_token": token}
        first = http.post("/schedules/trigger", data=form)
        second = http.post("/schedules/trigger", data=form)
        future = http.post("/schedules/trigger", data={**form, "at": "2999-01-01T00:00:00+00:00"})
    assert future.status_code == 400 and "still to come" in future.text
    assert first.status_code == second.status_code == 200
    assert "sent as job" in first.text
    assert "already sent" in second.text
    ids = {m for page in (first, second) for m in re.findall(r"[0-9a-f-]{36}", page.text)}
    assert len(ids) == 1
    (task_id,) = ids
    trail = [e for e in _audit_of_task(task_id, form["at"]) if e.event == "triggered"]
    assert [e.detail["sent"] for e in trail] == [True, False]
    assert {e.detail["actor"] for e in trail} == {"olivia@ops"}


def _audit_of_task(task_id: str, at: str) -> list[AuditEvent]:
    from conventions.schedules import entries as schedules

    entry = schedules.find(app, "watchdog")
    occurrence = entry.occurrence(datetime.fromisoformat(at))
    events = app.store.audit_for(occurrence.correlation_id)
    return [e for e in events if e.task_id == task_id]


def test_the_queues_page_and_its_json_show_every_queue(base_url: str) -> None:
    with client(base_url, "rita") as http:
        page = http.get("/queues")
        for _ in range(3):
            support_flaky.flaky.delay(item_id=f"item{uuid.uuid4().hex[:8]}")
        data = http.get("/queues.json").json()
    assert page.status_code == 200
    names = {row["queue"] for row in data["queues"]}
    assert {"email", "heavy"} <= names
    assert all(f'data-queue="{name}"' in page.text for name in names)
    (email,) = [row for row in data["queues"] if row["queue"] == "email"]
    assert email["in_per_s"] > 0  # three published since the page's reading
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_a_paused_queue_is_not_consumed_until_resumed(base_url: str) -> None:
    with client(base_url, "olivia@ops", "operator") as http:
        token = token_of(http, "/queues")
        no_reason = http.post("/queues/pause", data={"queue": "email", "csrf_token": token})
        assert no_reason.status_code == 400
        unknown = http.post(
            "/queues/pause", data={"queue": "nope", "reason": "r", "csrf_token": token}
        )
        assert unknown.status_code == 404
        paused = http.post(
            "/queues/pause",
            data={"queue": "email", "reason": "provider outage", "csrf_token": token},
        )
        try:
            assert paused.status_code == 200, paused.text
            assert "stopped taking from email" in paused.text
            data = http.get("/queues.json").json()
            (email,) = [row for row in data["queues"] if row["queue"] == "email"]
            assert email["paused"]["actor"] == "olivia@ops" and email["consumers"] == 0
            assert "paused by olivia@ops" in http.get("/queues").text
            story = uuid.uuid4().hex
            with bind(correlation_id=story):
                result = support_flaky.flaky.delay(item_id=f"item{uuid.uuid4().hex[:8]}")
            support_jobs.worker_had_its_chance()  # it fetches, but not from email
            assert [e.event for e in app.store.audit_for(story)] == ["published"]
        finally:
            resumed = http.post("/queues/resume", data={"queue": "email", "csrf_token": token})
    assert resumed.status_code == 200 and "take from email again" in resumed.text
    audit_event(story, "succeeded", result.id)
    trail = [e.event for e in app.store.audit_for("queue:email")]
    assert trail[-2:] == ["queue_paused", "queue_resumed"]


def test_a_selection_is_replayed_in_one_post_and_each_outcome_is_shown(base_url: str) -> None:
    (item_a, first), (item_b, second) = flaky_dead_letter(), flaky_dead_letter()
    fix(item_a)
    fix(item_b)
    with client(base_url, "olivia@ops", "operator") as http:
        token = token_of(http, "/dead-letters")
        listed = http.get("/dead-letters").text
        assert f'name="id" value="{first.id}"' in listed
        assert f'name="id" value="{second.id}"' in listed
        done = http.post(
            "/dead-letters/replay",
            data={
                "id": [first.id, second.id, "no-such-id"],
                "reason": "batch",
                "csrf_token": token,
            },
        )
    assert done.status_code == 409  # one of the three was refused
    assert done.text.count('class="outcome-replayed"') == 2
    assert "no dead letter with id" in done.text
    for record in (first, second):
        stored = app.store.get_dead_letter(record.id)
        assert stored is not None and stored.replayed_at is not None


def test_a_worker_starting_while_its_queue_is_paused_does_not_consume_it(
    base_url: str, thread_worker: Any
) -> None:
    """``queue_pauses.at_start``, the worker-start part (called here on the running
    worker's consumer, as ``worker_ready`` calls it on a starting one)."""
    from conventions.observability import queues
    from conventions.ops import pauses
    from conventions.worker import queue_pauses

    document = {"queue": "email", "actor": "olivia@ops", "at": "-", "reason": "outage"}
    app.store.put_state(pauses.QUEUES.record("email"), {**document, "workers": []}, None)
    with client(base_url, "olivia@ops", "operator") as http:
        token = token_of(http, "/queues")
        try:
            assert queue_pauses.at_start(app, thread_worker.consumer) == ["email"]
            eventually(lambda: queues.consumers(app, 1.0).get("email", 0) == 0, "the cancel")
            stored = app.store.get_state(pauses.QUEUES.record("email"))
            assert stored is not None
            assert stored["workers"] == [thread_worker.consumer.hostname]
            story = uuid.uuid4().hex
            with bind(correlation_id=story):
                result = support_flaky.flaky.delay(item_id=f"item{uuid.uuid4().hex[:8]}")
            support_jobs.worker_had_its_chance()  # it fetches, but not from email
            assert [e.event for e in app.store.audit_for(story)] == ["published"]
        finally:
            resumed = http.post("/queues/resume", data={"queue": "email", "csrf_token": token})
    assert resumed.status_code == 200
    assert thread_worker.consumer.hostname in resumed.text
    audit_event(story, "succeeded", result.id)


def test_an_operator_pauses_and_resumes_a_schedule_entry_and_the_audit_names_them(
    base_url: str,
) -> None:
    with client(base_url, "olivia@ops", "operator") as http:
        token = token_of(http, "/schedules")
        no_reason = http.post("/schedules/pause", data={"name": "watchdog", "csrf_token": token})
        unknown = http.post(
            "/schedules/pause", data={"name": "nope", "reason": "r", "csrf_token": token}
        )
        paused = http.post(
            "/schedules/pause",
            data={"name": "watchdog", "reason": "alerts storm", "csrf_token": token},
        )
        try:
            page = http.get("/schedules").text
        finally:
            resumed = http.post("/schedules/resume", data={"name": "watchdog", "csrf_token": token})
        again = http.post("/schedules/resume", data={"name": "watchdog", "csrf_token": token})
    assert (no_reason.status_code, unknown.status_code) == (400, 404)
    assert paused.status_code == 200 and "beat sends none of its occurrences" in paused.text
    assert "paused by olivia@ops" in page and "alerts storm" in page
    assert 'action="/schedules/resume"' in page
    assert resumed.status_code == 200 and "resumed" in resumed.text
    assert "was not paused" in again.text
    trail = [(e.event, e.detail.get("actor")) for e in app.store.audit_for("schedule:watchdog")]
    assert trail[-3:] == [
        ("schedule_paused", "olivia@ops"),
        ("schedule_resumed", "olivia@ops"),
        ("schedule_resumed", "olivia@ops"),
    ]
    with client(base_url, "rita", "read-only") as http:
        assert 'action="/schedules/pause"' not in http.get("/schedules").text
        token = csrf.token(SECRET, http.cookies[csrf.COOKIE], "rita")
        refused = http.post(
            "/schedules/pause", data={"name": "watchdog", "reason": "r", "csrf_token": token}
        )
    assert refused.status_code == 403 and "read-only" in refused.text
