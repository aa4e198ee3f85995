"""``conventions web`` as an operator starts it: a real process serving the console."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conventions.console import csrf
from tests.isolation import free_port

ROOT = Path(__file__).resolve().parents[2]
#: where ``conventions web`` reads the secret its processes share
SECRET_ENV = "CONVENTIONS_CONSOLE_SECRET"


def _serve(*args: str, secret: str | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "conventions", "-A", "tasks", "web", *args]
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret:
        env[SECRET_ENV] = secret
    return subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)


def _stop(process: subprocess.Popen[str]) -> str:
    """Stop ``process``; what it wrote on stderr."""
    if process.stderr is None or process.stderr.closed:
        return ""
    process.terminate()
    process.wait(10)
    err = process.stderr.read()
    process.stderr.close()
    return err


def _up(url: str, process: subprocess.Popen[str]) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "conventions web did not start"
            time.sleep(0.1)


#: the secret the two processes of one console share in these tests
SHARED = "a-secret-the-console-fleet-shares"
FORM = {"content-type": "application/x-www-form-urlencoded"}
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
#: a body far over the console's 64 KiB form limit (make test; 300 MB measured by hand)
HUGE = 50 * 1024 * 1024
#: how much the console's peak memory may grow while refusing it
BOUNDED = 20 * 1024 * 1024


@pytest.fixture
def served(services: None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    process = _serve("--insecure-local", "--port", str(port))
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def pair(services: None) -> Iterator[tuple[tuple[str, subprocess.Popen[str]], ...]]:
    """Two ``conventions web`` processes of one console (a load balancer's two backends),
    sharing ``CONVENTIONS_CONSOLE_SECRET``."""
    ports = (free_port(), free_port())
    processes = [_serve("--insecure-local", "--port", str(p), secret=SHARED) for p in ports]
    try:
        yield tuple((f"http://127.0.0.1:{p}", pr) for p, pr in zip(ports, processes, strict=True))
    finally:
        for process in processes:
            _stop(process)


def _peak_memory(process: subprocess.Popen[str]) -> int:
    """The process's peak resident memory so far (bytes, Linux's VmHWM)."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc")


def _form_of(url: str, process: subprocess.Popen[str]) -> tuple[str, str]:
    """The CSRF cookie and a form's token of the schedules page of ``url``."""
    page = _up(f"{url}/schedules", process)
    found = TOKEN.search(page.text)
    assert found and page.status_code == 200
    return page.cookies[csrf.COOKIE], found.group(1)


def test_insecure_local_serves_this_machine_as_its_admin(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    url, process = served
    page = _up(f"{url}/schedules", process)
    assert page.status_code == 200
    assert "local:" in page.text and "admin" in page.text
    assert "watchdog" in page.text
    rebound = httpx.get(f"{url}/schedules", headers={"host": "evil.example"}, timeout=5)
    assert rebound.status_code == 403


def test_a_huge_post_is_refused_without_being_read_into_memory(
    pair: tuple[tuple[str, subprocess.Popen[str]], ...],
) -> None:
    (url, process), _ = pair
    _form_of(url, process)  # warm: the pages and a form have been served once
    before = _peak_memory(process)
    body = b"a" * HUGE
    declared = httpx.post(f"{url}/queues/pause", content=body, headers=FORM, timeout=60)

    def chunks() -> Iterator[bytes]:
        for start in range(0, HUGE, 1 << 20):
            yield body[start : start + (1 << 20)]

    chunked = httpx.post(f"{url}/queues/pause", content=chunks(), headers=FORM, timeout=60)
    grown = _peak_memory(process) - before
    print(f"peak memory of conventions web: {before >> 20} MB, +{grown >> 20} MB after 2 x 50 MB")
    assert (declared.status_code, chunked.status_code) == (413, 413)
    assert "form too large" in declared.text
    assert "content-security-policy" in chunked.headers
    assert grown < BOUNDED, f"the console read {grown >> 20} MB of a refused body"


def test_a_form_served_by_one_console_process_is_accepted_by_another_with_the_shared_secret(
    pair: tuple[tuple[str, subprocess.Popen[str]], ...],
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    (a_url, a), (b_url, b) = pair
    cookie, token = _form_of(a_url, a)
    _up(f"{b_url}/schedules", b)
    form = {"name": "no-such-entry", "reason": "r", csrf.FIELD: token}
    # past the CSRF check, refused for the unknown entry only: nothing is paused
    on_b = httpx.post(f"{b_url}/schedules/pause", data=form, cookies={csrf.COOKIE: cookie})
    assert on_b.status_code == 404, on_b.text
    alone_url, alone = served  # a process with a secret of its own refuses it
    _up(f"{alone_url}/schedules", alone)
    refused = httpx.post(f"{alone_url}/schedules/pause", data=form, cookies={csrf.COOKIE: cookie})
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert "no shared secret" in _stop(alone)
    for process in (a, b):  # still running: their stderr is read at the end
        assert process.poll() is None


def test_an_expired_csrf_token_is_refused(
    pair: tuple[tuple[str, subprocess.Popen[str]], ...],
) -> None:
    (url, process), _ = pair
    cookie, token = _form_of(url, process)
    actor = re.search(r'class="who"[^>]*>([^<]+?) ·', _up(f"{url}/schedules", process).text)
    assert actor, "the page names its actor"
    issued = time.time() - csrf.MAX_AGE - 60
    stale = csrf.token(SHARED.encode(), cookie, actor.group(1).strip(), issued=issued)
    form = {"name": "no-such-entry", "reason": "r"}
    fresh = httpx.post(f"{url}/schedules/pause", data={**form, csrf.FIELD: token},
                       cookies={csrf.COOKIE: cookie})  # fmt: skip
    expired = httpx.post(f"{url}/schedules/pause", data={**form, csrf.FIELD: stale},
                         cookies={csrf.COOKIE: cookie})  # fmt: skip
    assert fresh.status_code == 404  # the same form with a token of now passes the check
    assert expired.status_code == 403 and "CSRF" in expired.text


def test_an_authorizer_is_loaded_from_module_colon_callable(services: None) -> None:
    port = free_port()
    process = _serve("--authorizer", "conventions.console.auth:local_admin", "--port", str(port))
    try:
        assert _up(f"http://127.0.0.1:{port}/queues", process).status_code == 200
    finally:
        process.terminate()
        process.wait(10)
        if process.stderr:
            process.stderr.close()
    bad = subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", "web", "--authorizer", "nope:x"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "--authorizer 'nope:x'" in bad.stderr


def test_mounted_in_fastapi_it_is_behind_the_apps_own_login(services: None) -> None:
    """The how-to's FastAPI shape: the host's AuthenticationMiddleware logs in, the
    console (mounted at /ops) reads ``request.user`` and ``request.auth``."""
    import threading

    import uvicorn
    from fastapi import FastAPI
    from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
    from starlette.middleware.authentication import AuthenticationMiddleware

    from conventions.console import Principal, Role, console_app
    from tasks import app as celery_app

    sessions = {"s-olivia": ("olivia@shop.example", True), "s-rita": ("rita@shop.example", False)}

    class SessionLogin(AuthenticationBackend):
        async def authenticate(self, conn: Any) -> tuple[AuthCredentials, SimpleUser] | None:
            found = sessions.get(conn.cookies.get("session", ""))
            if found is None:
                return None
            email, on_call = found
            scopes = ["ops:write"] if on_call else []
            return AuthCredentials(["authenticated", *scopes]), SimpleUser(email)

    def authorize(request: Any) -> Principal | None:
        if not request.user.is_authenticated:
            return None
        role = Role.OPERATOR if "ops:write" in request.auth.scopes else Role.READ_ONLY
        return Principal(request.user.display_name, role)

    api = FastAPI()
    api.add_middleware(AuthenticationMiddleware, backend=SessionLogin())
    api.mount("/ops", console_app(celery_app, authorizer=authorize))

    @api.get("/")
    def home() -> dict[str, str]:
        return {"app": "yours"}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/").json() == {"app": "yours"}
        assert httpx.get(f"{url}/ops/schedules").status_code == 403  # not logged in
        with httpx.Client(base_url=url, cookies={"session": "s-olivia"}) as olivia:
            page = olivia.get("/ops/schedules")
            assert page.status_code == 200
            assert "olivia@shop.example" in page.text and "operator" in page.text
            assert 'href="/ops/static/console.css"' in page.text
            assert 'action="/ops/schedules/trigger"' in page.text
            assert olivia.get("/ops/static/console.js").status_code == 200
            assert "Path=/ops;" in page.headers["set-cookie"]
            moved = olivia.get("/ops/", follow_redirects=False)
            assert moved.headers["location"] == "/ops/queues"
        with httpx.Client(base_url=url, cookies={"session": "s-rita"}) as rita:
            page = rita.get("/ops/schedules")
            assert "read-only" in page.text and "/ops/schedules/trigger" not in page.text
    finally:
        server.should_exit = True
        thread.join(10)


DJANGO_SETTINGS = """
SECRET_KEY = "console-test-secret"
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {db!r}}}}}
ROOT_URLCONF = "console_site.urls"
ALLOWED_HOSTS = ["127.0.0.1"]
USE_TZ = True
"""
DJANGO_URLS = """
from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("", lambda request: HttpResponse("django home"))]
"""
#: logs two users in with Django's test client and prints their session keys
DJANGO_LOGIN = """
import django
django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
call_command("migrate", verbosity=0)
admin = User.objects.create_superuser("ada", "ada@shop.example", "pw")
staff = User.objects.create_user("rita", "rita@shop.example", "pw", is_staff=True)
for user in (admin, staff):
    client = Client()
    client.force_login(user)
    print(client.cookies["sessionid"].value)
"""


def _howto_asgi() -> str:
    """The how-to's Django ``asgi.py``, pointed at this test's project and app."""
    text = (ROOT / "docs" / "howto" / "console.md").read_text()
    (code,) = [b for b in text.split("```python\n") if b.startswith("# myproject/asgi.py")]
    code = code.split("```")[0]
    return code.replace("myproject.settings", "console_site.settings").replace(
        "myproject.worker", "tasks"
    )


def test_served_from_django_it_is_behind_djangos_login(services: None, tmp_path: Path) -> None:
    """The how-to's Django ``asgi.py``, run as written: Django's session decides."""
    site = tmp_path / "console_site"
    site.mkdir()
    (site / "__init__.py").write_text("")
    (site / "settings.py").write_text(DJANGO_SETTINGS.format(db=str(tmp_path / "db.sqlite3")))
    (site / "urls.py").write_text(DJANGO_URLS)
    (site / "asgi.py").write_text(_howto_asgi())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "console_site.settings",
    }
    login = subprocess.run(
        [sys.executable, "-c", DJANGO_LOGIN],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    admin_session, staff_session = login.stdout.split()
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "console_site.asgi:application", "--port", str(port),
         "--log-level", "warning"],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        assert _up(f"{url}/", process).text == "django home"
        assert httpx.get(f"{url}/ops/schedules").status_code == 403
        admin = httpx.get(f"{url}/ops/schedules", cookies={"sessionid": admin_session})
        assert admin.status_code == 200 and "ada" in admin.text and "admin" in admin.text
        assert 'action="/ops/schedules/trigger"' in admin.text
        staff = httpx.get(f"{url}/ops/schedules", cookies={"sessionid": staff_session})
        assert "rita" in staff.text and "read-only" in staff.text
        assert "/ops/schedules/trigger" not in staff.text
    finally:
        process.terminate()
        process.wait(10)
        if process.stderr:
            process.stderr.close()
