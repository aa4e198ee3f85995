"""The console in a real browser (Debian's chromium, driven by Playwright), against a
real worker on Redis.

A dead letter appears on the page, is replayed from it with a reason, the replay's run
succeeds and the audit names the authorizer's actor; a read-only user has no replay
button and a POST is refused by role; an operator's POST without the page's CSRF token
is refused; hostile records run no script and break no policy; a schedule trigger
double-clicked sends once; the queues page refreshes itself; a job's run appears on the
runs page and its page shows its attempts; the queues' charts, the dead letters' search
and discard, the runs' refresh, a re-run and the schedules' cadence in one session.
With ``CONSOLE_SCREENSHOTS=1`` the test writes each page's screenshot to
docs/img/console-*.png (docs/howto/console.md shows them).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
import uvicorn

from conventions import bind
from conventions.console import Principal, Role, console_app, csrf
from conventions.store import series
from conventions.store.records import AuditEvent, DeadLetter
from tasks import app
from tests.fixtures import tool_unavailable, unavailable
from tests.integration import (
    support_console as hostile,  # registers testing.reset_link.v1 before the worker
)
from tests.integration import (
    support_flaky,  # registers testing.flaky.v1 before the worker
    support_jobs,  # registers testing.probe.v1 (the heavy-queue probe)
    support_runs,  # registers testing.runs_retry.v1
)
from tests.isolation import free_port

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
#: Debian's chromium, headless, quiet: nothing fetched from the network but our pages
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SECRET = b"console-browser-secret"
WAIT = 20.0

pytestmark = pytest.mark.usefixtures("thread_worker", "clean_store")


def by_headers(request: Any) -> Principal | None:
    """The test host's login: ``x-test-actor`` and ``x-test-role`` (the browser context
    sends them on every request, as a host app's session cookie would stand for them)."""
    actor = request.headers.get("x-test-actor")
    return (
        Principal(actor, Role(request.headers.get("x-test-role", "read-only"))) if actor else None
    )


@pytest.fixture(scope="module")
def base_url(services: None) -> Iterator[str]:
    port = free_port()
    web = console_app(app, authorizer=by_headers, secret=SECRET, refresh_seconds=1)
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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium under Playwright (never ``playwright install``)."""
    if not shutil.which(CHROMIUM):
        tool_unavailable("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        unavailable("playwright", exc)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_as(browser: Any, base_url: str) -> Iterator[Callable[..., Any]]:
    """A page of a browser context logged in as ``actor`` with ``role``."""
    contexts: list[Any] = []

    def open_page(actor: str, role: str, scheme: str = "light") -> Any:
        context = browser.new_context(
            base_url=base_url,
            extra_http_headers={"x-test-actor": actor, "x-test-role": role},
            color_scheme=scheme,
            viewport={"width": 1280, "height": 760},
        )
        context.set_default_timeout(WAIT * 1000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def shot(page: Any, name: str) -> None:
    """docs/img/console-<name>.png, when CONSOLE_SCREENSHOTS=1 (a normal run writes none)."""
    if os.environ.get("CONSOLE_SCREENSHOTS") == "1":
        page.screenshot(path=str(ROOT / "docs" / "img" / f"console-{name}.png"), full_page=True)


def eventually(find: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {WAIT:.0f}s waiting for {what}")


def dead_letter(task_id: str) -> DeadLetter:
    def find() -> DeadLetter | None:
        records = app.store.list_dead_letters(task="testing.flaky.v1", limit=1000)
        return next((r for r in records if r.task_id == task_id), None)

    return eventually(find, f"the dead letter of job {task_id}")


def audit_event(correlation_id: str, name: str, task_id: str) -> AuditEvent:
    def find() -> AuditEvent | None:
        events = app.store.audit_for(correlation_id)
        return next((e for e in events if e.event == name and e.task_id == task_id), None)

    return eventually(find, f"audit event {name!r} of job {task_id}")


def flaky_dead_letter(item: str) -> DeadLetter:
    with support_flaky.flags() as flags:
        flags.set(support_flaky.broken_flag(item), "1", ex=300)
    return dead_letter(support_flaky.flaky.delay(item_id=item).id)


def test_a_dead_letter_is_replayed_from_the_page_and_its_run_succeeds(
    open_as: Callable[..., Any],
) -> None:
    item = f"item{uuid.uuid4().hex[:8]}"
    record = flaky_dead_letter(item)
    page = open_as("olivia@ops", "operator")
    page.goto("/dead-letters")
    page.get_by_role("link", name="testing.flaky.v1").first.wait_for()
    page.locator(f'a[href="/dead-letters/{record.id}"]').click()
    page.get_by_text("provider refuses item").first.wait_for()
    shot(page, "dead-letter")
    with support_flaky.flags() as flags:  # the provider is fixed
        flags.delete(support_flaky.broken_flag(item))
    page.get_by_label("Reason").fill("provider fixed")
    page.get_by_role("button", name="Replay").click()
    page.locator(".outcome-replayed").wait_for()
    shot(page, "replayed")
    new_id = page.locator(".outcome-replayed td").nth(2).inner_text().strip()
    assert record.correlation_id
    replayed = audit_event(record.correlation_id, "replayed", new_id)
    assert replayed.detail["actor"] == "olivia@ops"
    assert replayed.detail["reason"] == "provider fixed"
    page.reload()  # the replay answered with a redirect: a reload replays nothing
    page.locator(".outcome-replayed").wait_for()
    events = app.store.audit_for(record.correlation_id)
    assert [e.event for e in events].count("replayed") == 1
    page.locator(".outcome-replayed a").first.click()  # back to the dead letter
    page.locator("#replays").wait_for()
    assert "olivia@ops" in page.locator("#replays").inner_text()
    assert page.get_by_role("button", name="Replay").count() == 0
    assert page.locator(f'#replays a[href="/runs/{new_id}"]').count() == 1
    audit_event(record.correlation_id, "succeeded", new_id)
    page.goto(f"/trace?correlation={record.correlation_id}")
    page.get_by_text("succeeded").first.wait_for()
    assert page.locator("li.job li.job").count() == 1  # the replay, under the failed job
    shot(page, "trace")


def test_an_operator_works_the_charts_lists_runs_and_schedules_in_one_session(
    open_as: Callable[..., Any],
) -> None:
    """The queues page opens on its charts; the dead letters are found by a bare key and
    one is discarded from the list; the runs page refreshes itself; an admin re-runs a
    succeeded job with force from its page; the schedules say their cadence in words.
    No page reports a CSP violation."""
    now = series.minute(datetime.now(UTC))
    for back in range(30, 0, -1):  # half an hour of samples: a burst, then calm
        done = 40 * (30 - back) + (300 if back < 10 else 0)
        row = {"published": done, "succeeded": done, "failed": (30 - back) // 6,
               "retried": (30 - back) // 3, "oldest": float(back % 7)}  # fmt: skip
        heavy = {**row, "succeeded": done // 4, "oldest": float(back % 11) * 3}
        series.record(app.store, now - timedelta(minutes=back), {"email": row, "heavy": heavy})
    page = open_as("ada", "admin")
    page.add_init_script(
        "window.__csp = []; document.addEventListener('securitypolicyviolation', "
        "(e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"
    )
    page.goto("/queues")
    assert page.locator("svg.chart").count() == 4
    assert page.locator('svg.chart path[data-queue="email"]').count() >= 3
    shot(page, "queues-charts")
    assert page.evaluate("window.__csp") == []

    records = [flaky_dead_letter(f"item{uuid.uuid4().hex[:8]}") for _ in range(2)]
    bare = str(records[0].idempotency_key).split(":", 1)[1]  # flaky:<item>, as the body sees it
    page.goto(f"/dead-letters?key={bare}")
    assert page.locator("#dead-letters tbody tr").count() == 1
    page.goto("/dead-letters")
    page.locator(f'tr[data-record="{records[1].id}"] input[name="id"]').check()
    page.get_by_label("Reason").fill("test items")
    page.get_by_role("button", name="Discard selected").click()
    page.locator("#done").wait_for()
    assert "1 discarded" in page.locator("#done").inner_text()
    assert app.store.get_dead_letter(records[1].id) is None
    shot(page, "dead-letters")

    job = support_runs.runs_retry.delay(item_id=f"item{uuid.uuid4().hex[:8]}")
    assert job.get(timeout=WAIT) == "ok"
    eventually(lambda: (run := app.store.get_run(job.id)) and not run.live, f"the run of {job.id}")
    page.goto("/runs")
    marker = page.locator("[data-refresh]")
    updated = "el => el.textContent.startsWith('updated')"
    page.wait_for_function(updated, arg=marker.element_handle())
    page.goto(f"/runs/{job.id}")
    page.locator("#rerun summary").click()
    page.get_by_label("Reason").fill("customer asked")
    page.get_by_label(re.compile("force")).check()
    page.get_by_role("button", name="Re-run").click()
    page.get_by_text("Re-run of").wait_for()
    new_id = page.url.rsplit("/", 1)[1]
    assert new_id != job.id
    eventually(lambda: (run := app.store.get_run(new_id)) and run.state == "succeeded", "re-run")

    page.goto("/schedules")
    assert page.get_by_text("daily at 03:00 Asia/Bangkok").count() == 1
    page.locator("#beat-down").wait_for()
    shot(page, "schedules")
    assert page.evaluate("window.__csp") == []


def test_a_read_only_user_has_no_replay_and_a_forged_post_is_refused(
    open_as: Callable[..., Any], base_url: str
) -> None:
    record = flaky_dead_letter(f"item{uuid.uuid4().hex[:8]}")
    page = open_as("rita", "read-only", scheme="dark")
    page.goto(f"/dead-letters/{record.id}")
    page.get_by_text("cannot replay").wait_for()
    assert page.get_by_role("button", name="Replay").count() == 0
    shot(page, "read-only-dark")
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    token = csrf.token(SECRET, cookies[csrf.COOKIE], "rita")
    url = f"{base_url}/dead-letters/replay"
    form = {"id": record.id, "reason": "me", "csrf_token": token}
    assert page.request.post(url, form=form).status == 403  # the role, with a valid token
    stored = app.store.get_dead_letter(record.id)
    assert stored is not None and stored.replayed_at is None


def test_an_operators_post_without_the_pages_token_is_refused(
    open_as: Callable[..., Any], base_url: str
) -> None:
    """An operator may replay: only the CSRF check stands between these POSTs and a
    replay, and the page's own form (its token) then replays the same record."""
    item = f"item{uuid.uuid4().hex[:8]}"
    record = flaky_dead_letter(item)
    page = open_as("olivia@ops", "operator")
    page.goto(f"/dead-letters/{record.id}")
    page.get_by_label("Reason").wait_for()
    nonce = {c["name"]: c["value"] for c in page.context.cookies()}[csrf.COOKIE]
    url = f"{base_url}/dead-letters/replay"
    form = {"id": record.id, "reason": "forged"}
    forged = [
        "",  # none
        csrf.token(b"not-the-consoles-secret", nonce, "olivia@ops"),  # another secret
        csrf.token(SECRET, nonce, "mallory"),  # another actor's
        csrf.token(SECRET, nonce, "olivia@ops", issued=time.time() - csrf.MAX_AGE - 60),
    ]
    for token in forged:
        answer = page.request.post(url, form={**form, "csrf_token": token})
        assert answer.status == 403 and "CSRF" in answer.text(), token
    stored = app.store.get_dead_letter(record.id)
    assert stored is not None and stored.replayed_at is None
    with support_flaky.flags() as flags:  # the provider is fixed
        flags.delete(support_flaky.broken_flag(item))
    page.get_by_label("Reason").fill("provider fixed")
    page.get_by_role("button", name="Replay").click()
    page.locator(".outcome-replayed").wait_for()


def test_hostile_records_run_no_script_and_break_no_policy_in_the_browser(
    open_as: Callable[..., Any],
) -> None:
    """Script tags, quotes and ``javascript:`` URLs in every field of every page: no
    ``alert()`` runs and the content security policy reports nothing (an injected inline
    script or handler would be blocked by it, and reported)."""
    record = hostile.hostile_everywhere()
    page = open_as("ada", "admin")
    alerts: list[str] = []
    page.on("dialog", lambda dialog: (alerts.append(dialog.message), dialog.dismiss()))
    page.add_init_script(
        "window.__csp = []; document.addEventListener('securitypolicyviolation', "
        "(e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"
    )
    violations: list[str] = []
    pages = [
        "/queues", "/runs", f"/runs/{hostile.XSS_ID}", "/dead-letters",
        f"/dead-letters/{record.id}", "/schedules", f"/trace?correlation={hostile.XSS}",
        f"/runs/{hostile.XSS_ID}x", f"/dead-letters?q={quote(hostile.XSS)}&sort=task",
        f"/runs?q={quote(hostile.XSS)}&key={quote(hostile.XSS)}",
    ]  # fmt: skip
    try:
        for path in pages:
            page.goto(path)
            page.locator("main").wait_for()
            page.keyboard.press("Tab")  # an injected autofocus/onfocus would fire now
            violations += [f"{path}: {v}" for v in page.evaluate("window.__csp")]
    finally:
        hostile.clear_pauses()
    assert alerts == []
    assert violations == []
    page.goto(f"/dead-letters/{record.id}")
    assert "<script>alert(2)</script>" in page.locator("pre").first.inner_text()


def test_a_schedule_trigger_double_clicked_sends_once(open_as: Callable[..., Any]) -> None:
    page = open_as("olivia@ops", "operator")
    page.goto("/schedules")
    row = page.locator("tr", has_text="watchdog")
    at = row.locator('input[name="at"]').get_attribute("value")
    row.get_by_role("button", name="Trigger").dblclick()
    page.locator("#trigger-outcome").wait_for()
    from datetime import datetime

    from conventions.schedules import entries as schedules

    occurrence = schedules.find(app, "watchdog").occurrence(datetime.fromisoformat(str(at)))
    events = app.store.audit_for(occurrence.correlation_id)
    published = [e for e in events if e.event == "published"]
    assert len(published) == 1, events
    sent = [e.detail["sent"] for e in events if e.event == "triggered"]
    assert sent.count(True) == 1 and set(sent) <= {True, False}
    assert (
        page.locator("#trigger-outcome").inner_text().startswith(f"Occurrence {occurrence.label}")
    )


def test_the_queues_page_refreshes_itself(open_as: Callable[..., Any]) -> None:
    for scheme in ("light", "dark"):
        page = open_as("rita", "read-only", scheme=scheme)
        page.goto("/queues")
        page.locator('tr[data-queue="email"]').wait_for()
        marker = page.locator("[data-live]")
        page.wait_for_function(
            "el => el.textContent.startsWith('updated')", arg=marker.element_handle()
        )
        assert re.match(r"updated ", marker.inner_text())
        shot(page, f"queues-{scheme}")


def test_a_queue_paused_from_the_page_is_not_consumed_until_resumed(
    open_as: Callable[..., Any],
) -> None:
    page = open_as("olivia@ops", "operator")
    page.goto("/queues")
    row = page.locator('tr[data-queue="email"]')
    row.get_by_label("reason to pause email").fill("provider outage")
    row.get_by_role("button", name="Pause").click()
    page.locator("#pause-outcome").wait_for()
    story = uuid.uuid4().hex
    try:
        assert "stopped taking from email" in page.locator("#pause-outcome").inner_text()
        with bind(correlation_id=story):
            result = support_flaky.flaky.delay(item_id=f"item{uuid.uuid4().hex[:8]}")
        page.goto("/queues")
        page.get_by_text("paused by olivia@ops").wait_for()
        shot(page, "queues-paused")
        support_jobs.worker_had_its_chance()  # it fetches, but not from email
        assert [e.event for e in app.store.audit_for(story)] == ["published"]
    finally:
        page.goto("/queues")
        page.locator('tr[data-queue="email"]').get_by_role("button", name="Resume").click()
        page.locator("#pause-outcome").wait_for()
    assert "take from email again" in page.locator("#pause-outcome").inner_text()
    audit_event(story, "succeeded", result.id)
    paused = [e for e in app.store.audit_for("queue:email") if e.event == "queue_paused"]
    assert paused[-1].detail["actor"] == "olivia@ops"


def test_a_jobs_run_appears_on_the_runs_page_and_its_page_shows_its_attempts(
    open_as: Callable[..., Any],
) -> None:
    item = f"item{uuid.uuid4().hex[:8]}"
    job = support_runs.runs_retry.delay(item_id=item)
    assert job.get(timeout=WAIT) == "ok"
    eventually(lambda: (run := app.store.get_run(job.id)) and not run.live, f"the run of {job.id}")
    page = open_as("olivia@ops", "operator")
    page.goto("/runs?task=testing.runs_retry.v1")
    link = page.locator(f'a[href="/runs/{job.id}"]')
    link.wait_for()
    shot(page, "runs")
    link.click()
    page.locator("#attempts").wait_for()
    rows = page.locator("#attempts tbody tr")
    assert rows.count() == 2
    assert "retried" in rows.nth(0).inner_text() and "succeeded" in rows.nth(1).inner_text()
    assert "TransientError: the provider timed out" in rows.nth(0).inner_text()
    assert f"attempt 2 of item {item}" in page.locator("#logs").inner_text()
    shot(page, "runs-detail")
