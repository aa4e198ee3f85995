"""The console's rules that need no service: roles, CSRF tokens, who may be let in
without an authorizer, the one-line error without the extra, ``conventions web``'s
refusals."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from conventions.cli.main import main
from conventions.console import auth, csrf, views
from conventions.console.auth import Principal, Role
from conventions.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("role", "allowed"),
    [
        (Role.READ_ONLY, {"view"}),
        (Role.OPERATOR, {"view", "replay", "trigger", "pause", "discard", "end-member"}),
        (
            Role.ADMIN,
            {"view", "replay", "trigger", "pause", "discard", "end-member"}
            | {"force-replay", "rerun"},
        ),
    ],
)
def test_each_role_may_what_the_lower_roles_may_and_no_more(role: Role, allowed: set[str]) -> None:
    who = Principal("someone", role)
    assert {action for action in auth.ACTIONS if who.may(action)} == allowed


def test_a_principal_needs_an_actor_and_a_known_role() -> None:
    with pytest.raises(ValueError, match="actor"):
        Principal("  ", Role.ADMIN)
    with pytest.raises(ValueError):
        Principal("x", "superuser")  # type: ignore[arg-type]
    assert Principal("x", "operator").role is Role.OPERATOR  # type: ignore[arg-type]


def test_a_csrf_token_expires_after_its_max_age() -> None:
    secret, nonce, now = b"s" * 32, csrf.new_nonce(), 1_800_000_000.0
    fresh = csrf.token(secret, nonce, "alice", issued=now - csrf.MAX_AGE + 60)
    stale = csrf.token(secret, nonce, "alice", issued=now - csrf.MAX_AGE - 1)
    ahead = csrf.token(secret, nonce, "alice", issued=now + csrf.SKEW + 60)
    assert csrf.valid(secret, nonce, "alice", fresh, now=now)
    assert not csrf.valid(secret, nonce, "alice", stale, now=now)
    assert not csrf.valid(secret, nonce, "alice", ahead, now=now)
    issued, _, signature = fresh.partition(".")
    moved = f"{int(issued) + 3600}.{signature}"  # a later issue time, the same signature
    assert not csrf.valid(secret, nonce, "alice", moved, now=now)


@pytest.mark.parametrize(
    "forged",
    ["1.é", "²³.00", "1." + "\udcff", "x" * 5000, ".", "99999999999999999999.00", "\x00"],
)
def test_a_forged_csrf_token_of_any_shape_is_refused_not_raised(forged: str) -> None:
    assert not csrf.valid(b"s" * 32, csrf.new_nonce(), "alice", forged)


def test_a_console_secret_comes_from_the_call_or_the_setting_and_is_long_enough() -> None:
    conf = {csrf.SETTING: "a-setting-secret-of-the-fleet"}
    assert csrf.shared_secret(conf) == b"a-setting-secret-of-the-fleet"
    assert (
        csrf.shared_secret(conf, b"given-wins-over-the-setting") == b"given-wins-over-the-setting"
    )
    assert csrf.shared_secret({}) is None
    with pytest.raises(ValueError, match="at least 16 bytes"):
        csrf.shared_secret({}, "short")


def test_a_csrf_token_holds_only_for_its_nonce_actor_and_secret() -> None:
    secret, nonce = b"s" * 32, csrf.new_nonce()
    good = csrf.token(secret, nonce, "alice")
    assert csrf.valid(secret, nonce, "alice", good)
    assert not csrf.valid(secret, nonce, "bob", good)
    assert not csrf.valid(secret, csrf.new_nonce(), "alice", good)
    assert not csrf.valid(b"t" * 32, nonce, "alice", good)
    assert not csrf.valid(secret, None, "alice", good)
    assert not csrf.valid(secret, nonce, "alice", "")
    assert csrf.new_nonce() != nonce


@pytest.mark.parametrize(
    ("host", "local"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.3.4.5", True),
     ("10.0.0.7", False), ("0.0.0.0", False), ("example.org", False), ("", False)],
)  # fmt: skip
def test_loopback_is_this_machine_only(host: str, local: bool) -> None:
    assert auth.is_loopback(host) is local


def _request(client: str | None, host: str | None = "127.0.0.1") -> SimpleNamespace:
    """What ``local_admin`` reads of a Starlette request: the peer and the Host."""
    peer = SimpleNamespace(host=client) if client else None
    return SimpleNamespace(client=peer, url=SimpleNamespace(hostname=host))


def test_the_insecure_local_authorizer_lets_in_this_machine_only() -> None:
    here = auth.local_admin(_request("127.0.0.1"))
    assert here is not None and here.role is Role.ADMIN and here.actor.startswith("local:")
    assert auth.local_admin(_request("::1", "localhost")) is not None
    assert auth.local_admin(_request("192.168.1.9")) is None
    assert auth.local_admin(_request(None)) is None


def test_the_insecure_local_authorizer_refuses_a_page_asked_for_by_another_name() -> None:
    """DNS rebinding: a site re-pointed at 127.0.0.1 sends its own Host."""
    assert auth.local_admin(_request("127.0.0.1", "evil.example")) is None
    assert auth.local_admin(_request("127.0.0.1", None)) is None


def test_the_console_is_not_built_without_an_authorizer_unless_insecure_local() -> None:
    from conventions.console import console_app

    with pytest.raises(ConfigurationError, match="needs an authorizer"):
        console_app(object())
    web = console_app(object(), insecure_local=True)
    assert web.state.console.shared_secret is False  # random, this process's own
    # escaping is proved by rendering hostile records: tests/integration/test_console_hostile.py


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing is served without --authorizer"),
        (["--insecure-local", "--host", "0.0.0.0"], "serves loopback only"),
        (["--insecure-local", "--authorizer", "x:y"], "exclude each other"),
    ],
)
def test_conventions_web_refuses_to_serve_without_an_authorizer(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-A", "tasks", "web", *args]) == 2
    assert message in capsys.readouterr().err


def test_without_the_extra_the_console_is_one_line_naming_it() -> None:
    code = (
        "import sys; sys.modules['starlette'] = None\n"
        "import conventions.console.auth, conventions.ops.pauses\n"
        "try:\n    from conventions.console import console_app\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.stdout.strip() == (
        "MissingExtra the operator's console needs the 'console' extra: "
        "pip install 'celery-conventions[console]'"
    )


def test_since_takes_a_duration_or_a_date() -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert views.parse_since("2h", now) == now - timedelta(hours=2)
    assert views.parse_since("2026-11-30") == datetime(2026, 11, 30, tzinfo=UTC)
    assert views.parse_since(" ") is None
    with pytest.raises(ValueError):
        views.parse_since("yesterday")


@pytest.mark.parametrize(
    "text",
    ["3000000d", "99999999999999999999999999999s", "0001-01-01T00:00:00+23:59", "9" * 400 + "d"],
)
def test_since_reaching_outside_the_calendar_is_an_input_error(text: str) -> None:
    with pytest.raises(ValueError, match="too far back"):
        views.parse_since(text)


def test_what_the_console_shows_of_a_payload_is_scrubbed() -> None:
    shown = views.scrubbed({"to": ["ann@example.org"], "note": "password=hunter2", "n": 3})
    assert shown == {"to": ["<email>"], "note": "password=<redacted>", "n": 3}
