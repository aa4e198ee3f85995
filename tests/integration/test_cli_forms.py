"""The ``conventions`` command in its two forms, against real Redis and real processes.

``celery -A APP conventions ...`` (a plugin of Celery's CLI, through the
``celery.commands`` entry point) and ``conventions -A APP ...`` (the console script)
run the same commands on the same app; neither has a default app; every listing prints
JSON that parses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from conventions.cli import main as cli
from tasks import app

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: a hang guard only: every command here answers in seconds
HANG_GUARD = 30.0

pytestmark = pytest.mark.usefixtures("clean_store")


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """A real process of the project, with the test's Redis databases (and ``env``:
    an empty value removes the variable)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    environ = {name: value for name, value in environ.items() if value != ""}
    return subprocess.run(
        argv, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=HANG_GUARD,
        check=False,
    )  # fmt: skip


def reserved_key() -> tuple[str, str]:
    """A key held in the app's store by a job id, for a command to find."""
    key, job_id = f"cli-forms:{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    app.store.reserve(key, job_id, 60)
    return key, job_id


def test_celery_runs_the_conventions_plugin_on_the_app_celery_loaded() -> None:
    key, job_id = reserved_key()

    done = run([str(BIN / "celery"), "-A", "tasks", "conventions", "keys", "show", key, "--json"])

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reserved_by"] == job_id


def test_the_standalone_command_runs_the_app_named_by_a() -> None:
    key, job_id = reserved_key()

    done = run([str(BIN / "conventions"), "-A", "tasks", "keys", "show", key, "--json"])

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reserved_by"] == job_id


def test_the_standalone_command_takes_the_app_from_conventions_app() -> None:
    key, job_id = reserved_key()

    done = run([sys.executable, "-m", "conventions", "keys", "show", key, "--json"],
               CONVENTIONS_APP="tasks")  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reserved_by"] == job_id


def test_without_an_app_the_standalone_command_exits_2_with_one_line() -> None:
    done = run([str(BIN / "conventions"), "dlq", "list"], CONVENTIONS_APP="")

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no app" in done.stderr and "-A MODULE" in done.stderr
    assert done.stdout == ""


def test_inside_celery_without_an_app_the_plugin_exits_2_with_one_line() -> None:
    done = run([str(BIN / "celery"), "conventions", "dlq", "list"], CONVENTIONS_APP="")

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not a conventions.App" in done.stderr


def test_a_bad_option_inside_celery_is_one_line_too() -> None:
    done = run([str(BIN / "celery"), "-A", "tasks", "conventions", "dlq", "list", "--limit", "0"])

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "celery conventions dlq list --help" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [["conventions", "--version"], ["celery", "conventions", "--version"]],
    ids=["standalone", "plugin"],
)
def test_version_prints_the_distributions_version(argv: list[str]) -> None:
    done = run([str(BIN / argv[0]), *argv[1:]], CONVENTIONS_APP="")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"conventions {cli.version()}"


# -- --json on every listing ---------------------------------------------------------------

LISTINGS = {
    "dlq list": (["dlq", "list", "--json"], 0),
    "queues": (["queues", "--json"], 0),
    "schedule list": (["schedule", "list", "--json"], 0),
    "keys show": (["keys", "show", "nothing:here", "--json"], 1),  # nothing held: exit 1
    "status": (["status", "no-such-job", "--json"], 1),
    "doctor": (["doctor", "--json", "--static"], None),
    "trace": (["trace", "no-such-story", "--json"], 1),
}


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_every_listing_prints_json_that_parses(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, expected = LISTINGS[name]

    code = cli.main(["-A", "tasks", *argv])

    out, err = capsys.readouterr()
    assert expected is None or code == expected, err
    parsed: Any = json.loads(out)
    assert isinstance(parsed, list | dict)


def test_the_schedule_list_json_names_each_entry_and_its_next_occurrence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["-A", "tasks", "schedule", "list", "--json"]) == 0

    entries = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert entries["daily-sales"]["task"] == "reports.daily_sales.v1"
    assert entries["daily-sales"]["next"]
    assert entries["daily-sales"]["last_success"] is None


@pytest.mark.parametrize("action", ["status", "dead"])
def test_the_outbox_listings_print_json_that_parses(
    action: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"

    code = cli.main(["-A", "tasks", "outbox", action, "--url", url, "--json"])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert isinstance(json.loads(out), list | dict)
