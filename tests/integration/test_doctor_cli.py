"""``conventions doctor`` checks the app's own settings, not the bounded ones the command
runs with: the command turns ``result_backend_always_retry`` off for its own reads, and
an app built with ``reliable()`` must not be warned about it (every adopter was). Through
the real console script, on an app module of the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BROKER_DB, REDIS_BASE, STORE_DB

BIN = Path(sys.executable).parent
#: a hang guard only: the command answers in seconds
HANG_GUARD = 60.0

APP = """
from conventions import App
from conventions.config import profile

app = App("adopter_doctor")
app.conf.update(profile.reliable(
    broker_url="{broker}", store_url="{store}", result_backend="{store}", {extra}
))
app.conf.conventions_doctor_levels = {{"redis-no-persistence": "off"}}
"""


def doctor(tmp_path: Path, extra: str = "") -> list[dict[str, Any]]:
    """The findings of ``conventions -A adopter_doctor doctor --static --json``."""
    broker, store = f"{REDIS_BASE}/{BROKER_DB}", f"{REDIS_BASE}/{STORE_DB}"
    (tmp_path / "adopter_doctor.py").write_text(APP.format(broker=broker, store=store, extra=extra))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [str(BIN / "conventions"), "-A", "adopter_doctor", "doctor", "--static", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD,
        check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return list(json.loads(done.stdout)["findings"])


@pytest.mark.usefixtures("services")
def test_doctor_does_not_warn_that_results_are_not_retried_for_a_reliable_app(
    tmp_path: Path,
) -> None:
    codes = {finding["code"] for finding in doctor(tmp_path)}

    assert "result-write-not-retried" not in codes


@pytest.mark.usefixtures("services")
def test_doctor_still_warns_when_the_app_itself_turns_result_retries_off(tmp_path: Path) -> None:
    found = doctor(
        tmp_path,
        "result_backend_always_retry=False, allow={'result_backend_always_retry'}",
    )

    codes = {finding["code"] for finding in found}
    assert "result-write-not-retried" in codes
