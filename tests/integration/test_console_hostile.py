"""The console against hostile input and hostile records, on the real store (Redis).

Every route (enumerated from the app, so a new one is covered) is sent huge numbers,
negative ones, NUL, unicode and very long values in its query and form fields: each
answer is below 500 and carries the security headers. Every page is rendered with
script tags, quotes and ``javascript:`` URLs in every field of the records it shows:
nothing comes back as markup. A field declared ``sensitive`` (and a key built from it)
is shown redacted on every surface, the CLI's included. A trigger of an occurrence the
page does not offer is refused and audited. The app is served by uvicorn in a thread;
``test_console_web`` covers a real ``conventions web`` process.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import uvicorn
from starlette.routing import Mount, Route

import tasks
from conventions.cli.main import main
from conventions.console import console_app, csrf
from conventions.console.pages import queues
from conventions.schedules import entries as schedules
from tasks import app
from tests.integration import support_console as hostile
from tests.integration.helpers import wait_for
from tests.integration.test_console import SECRET, by_headers
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("clean_store")

#: what each field of each route is fuzzed with
HOSTILE = [
    "99999999999999999999999999999s",
    "3000000d",
    "-1",
    "-99999999999999999999",
    "0001-01-01T00:00:00+23:59",
    "9999-12-31T23:59:59-23:59",
    "a\x00b",
    "\u202e\ufeff\U0001f4a5é\udcff",
    "x" * 1000,
    "184467440737095517",
    hostile.XSS,
]
#: every field any page reads from its query or form
FIELDS = (
    "task", "state", "key", "correlation", "queue", "since", "category", "id", "reason",
    "force", "name", "at", "page", "sort", "q",
)  # fmt: skip
#: the only route anyone may read without the authorizer: the stylesheet and the script
PUBLIC = {"/static"}
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
JAVASCRIPT_URL = re.compile(r"""(href|src|action|formaction)\s*=\s*["']?\s*javascript:""", re.I)


@pytest.fixture(scope="module")
def base_url(services: None) -> Iterator[str]:
    """The console of the reference app, served by a real uvicorn in a thread."""
    port = free_port()
    web = console_app(app, authorizer=by_headers, secret=SECRET)
    config = uvicorn.Config(web, host="127.0.0.1", port=port, log_level="critical")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=10)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def console(base_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    """The console as an admin sees it (every action allowed)."""
    monkeypatch.setattr(queues, "CONSUMERS_TIMEOUT", 0.05)  # no worker answers here
    headers = {"x-test-actor": "ada", "x-test-role": "admin"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as client:
        yield client


def secure(response: Any) -> None:
    assert response.status_code < 500, (response.request.url, response.text[:300])
    policy = response.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy, (response.status_code, response.request.url)
    assert response.headers.get("x-frame-options") == "DENY"


def token(client: httpx.Client) -> str:
    found = TOKEN.search(client.get("/schedules").text)
    assert found, "the schedules page has a form with its token"
    return found.group(1)


def encoded(fields: dict[str, str]) -> str:
    """A query or form body as a browser sends it, lone surrogates too (as raw bytes)."""

    def quoted(text: str) -> str:
        return quote(text.encode("utf-8", "surrogatepass"), safe="")

    return "&".join(f"{quoted(name)}={quoted(value)}" for name, value in fields.items())


FORM = {"content-type": "application/x-www-form-urlencoded"}


def routes() -> list[tuple[str, set[str]]]:
    web = console_app(app, authorizer=by_headers, secret=SECRET)
    found = []
    for route in web.routes:
        if isinstance(route, Route):
            found.append((route.path, set(route.methods or ())))
        else:
            assert isinstance(route, Mount) and route.path in PUBLIC, route
    return found


def test_every_route_answers_hostile_input_below_500_with_the_security_headers(
    console: httpx.Client,
) -> None:
    csrf_token = token(console)
    for path, methods in routes():
        for value in HOSTILE:
            url = path
            for name in re.findall(r"\{[^}]+\}", path):
                url = url.replace(name, encoded({"": value})[1:])
            if "GET" in methods:
                secure(console.get(f"{url}?{encoded(dict.fromkeys(FIELDS, value))}"))
            if "POST" in methods:
                form = {**dict.fromkeys(FIELDS, value), csrf.FIELD: csrf_token}
                secure(console.post(url, content=encoded(form), headers=FORM))
    for at in HOSTILE[:6]:  # a real entry, a hostile occurrence
        form = {"name": "watchdog", "at": at, csrf.FIELD: csrf_token}
        secure(console.post("/schedules/trigger", content=encoded(form), headers=FORM))


@pytest.mark.parametrize(
    ("method", "url", "form", "status", "reason"),
    [
        ("GET", "/runs?since=3000000d", None, 400, "too far back"),
        ("GET", "/dead-letters?since=99999999999999999999999999999s", None, 400, "too far back"),
        ("POST", "/schedules/trigger", {"name": "watchdog", "at": "0001-01-01T00:00:00"}, 400,
         "not an occurrence an operator may send"),
        ("GET", "/runs?key=a%00b", None, 400, "NUL"),
        ("GET", "/dead-letters?page=184467440737095517", None, 400, "past the last page"),
        ("GET", "/runs?page=184467440737095517", None, 400, "past the last page"),
        ("GET", "/dead-letters?page=1e3", None, 400, "is not a number"),
        ("GET", "/no-such-page", None, 404, "no such page"),
        ("POST", "/queues", {}, 405, "does not take that method"),
    ],
)  # fmt: skip
def test_an_input_error_is_a_4xx_with_its_reason_and_the_security_headers(  # noqa: PLR0917
    console: httpx.Client, method: str, url: str, form: dict[str, str] | None, status: int,
    reason: str,
) -> None:  # fmt: skip
    if form is None:
        answer = console.get(url)
    else:
        answer = console.post(url, data={**form, csrf.FIELD: token(console)})
    secure(answer)
    assert answer.status_code == status, answer.text[:300]
    assert reason in answer.text


def test_an_unexpected_exception_is_a_500_with_the_security_headers(
    console: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app.store.__class__, "list_dead_letters", broken)
    answer = console.get("/dead-letters")
    assert answer.status_code == 500
    secure_headers = answer.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in secure_headers
    assert answer.headers.get("x-frame-options") == "DENY"
    assert "a bug" not in answer.text


def unescaped(html: str) -> list[str]:
    """What of the hostile text came back as markup."""
    found = [tag for tag in ("<script>alert", "<img src=x", "<svg onload") if tag in html]
    found += [m.group(0) for m in JAVASCRIPT_URL.finditer(html)]
    found += [s for s in ("' autofocus", "\"'>") if s in html]
    return found


def test_every_page_shows_hostile_records_as_text_never_as_markup(console: httpx.Client) -> None:
    record = hostile.hostile_everywhere()
    try:
        pages = [
            "/queues", "/runs", f"/runs/{hostile.XSS_ID}", "/dead-letters",
            f"/dead-letters/{record.id}", "/schedules", "/trace?correlation=" + hostile.XSS,
            f"/runs/{hostile.XSS_ID}x", f"/dead-letters?category={hostile.XSS}",
            f"/runs?state={hostile.XSS}",
        ]  # fmt: skip
        for path in pages:
            page = console.get(path)
            secure(page)
            assert page.status_code in (200, 400, 404), (path, page.status_code)
            assert unescaped(page.text) == [], path
        shown = console.get(f"/dead-letters/{record.id}").text
        assert "javascript:alert(1)//&#34;&#39;&gt;&lt;script&gt;" in shown  # there, as text
        assert "alert(5)" in console.get("/runs").text  # the hostile run is listed
    finally:
        hostile.clear_pauses()


def test_a_sensitive_field_and_the_key_built_from_it_are_redacted_on_every_surface(
    console: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    key = f"reset:u_1:{hostile.TOKEN}"
    payload = {"user_id": "u_1", "reset_token": hostile.TOKEN}
    text = f"provider refused {hostile.TOKEN}"
    record = hostile.dead_letter("testing.reset_link.v1", key, payload, text, "x")
    task_id = uuid.uuid4().hex
    hostile.run("testing.reset_link.v1", task_id, key, "x")
    tasks.app.store.reserve(f"testing.reset_link:{key}", task_id, 300)  # keys show: held
    pages = ["/dead-letters", f"/dead-letters/{record.id}", "/runs", f"/runs/{task_id}"]
    pages.append("/trace?correlation=x")  # the run's audit trail (its events carry the key)
    for path in pages:
        page = console.get(path)
        assert page.status_code == 200, path
        assert hostile.TOKEN not in page.text, path
    assert "reset:u_1:&lt;redacted&gt;" in console.get(f"/dead-letters/{record.id}").text
    commands = [
        ["dlq", "show", record.id], ["dlq", "show", record.id, "--json"], ["dlq", "list"],
        ["runs", "show", task_id], ["runs", "show", task_id, "--json"], ["keys", "show", key],
        ["keys", "show", key, "--json"], ["trace", "x", "--json"],
    ]  # fmt: skip
    for argv in commands:
        assert main(["-A", "tasks", *argv]) == 0, argv
        out, err = capsys.readouterr()
        assert hostile.TOKEN not in out + err, argv
        assert "u_1" in out or argv[:2] == ["dlq", "list"], argv


def test_a_trigger_of_an_occurrence_not_offered_is_refused_and_audited(
    console: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = console.post(
        "/schedules/trigger",
        data={"name": "watchdog", "at": "1999-03-04", csrf.FIELD: token(console)},
    )
    assert refused.status_code == 400, refused.text[:300]
    assert "not an occurrence an operator may send" in refused.text
    assert main(["-A", "tasks", "schedule", "trigger", "watchdog", "--at", "1999-03-04",
                 "--actor", "olivia"]) == 2  # fmt: skip
    assert "not an occurrence an operator may send" in capsys.readouterr().err
    trail = [e for e in app.store.audit_for("schedule:watchdog") if e.event == "trigger_refused"]
    assert [(e.detail["actor"], e.detail["asked"]) for e in trail] == [
        ("ada", "1999-03-04"),
        ("olivia", "1999-03-04"),
    ]
    entry = schedules.find(app, "watchdog")
    old = entry.schedule.latest(datetime(1999, 3, 4, 23, 59, tzinfo=UTC))
    assert old is not None
    assert app.store.audit_for(entry.occurrence(old).correlation_id) == []  # nothing sent


def test_a_dead_letter_shows_the_trace_id_of_a_well_formed_traceparent_only(
    console: httpx.Client,
) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    shown_ids = []
    for parent in (f"00-{trace}-00f067aa0ba902b7-01", f"00-{trace}<b>-x-01"):
        record = hostile.dead_letter("testing.reset_link.v1", "k", {}, "x")
        record = dataclasses.replace(record, headers={**record.headers, "traceparent": parent})
        app.store.put_dead_letter(record)
        page = console.get(f"/dead-letters/{record.id}").text
        shown_ids.append(re.search(r'id="trace-id">([^<]*)<', page).group(1))  # type: ignore[union-attr]
    assert shown_ids == [trace, "-"]
