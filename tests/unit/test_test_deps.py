"""``make test`` on a fresh machine: the system tools some tests need are installed by
``scripts/test-deps.sh`` when it can (root, apt-get), and a test skipped for a missing
tool says exactly which package to install (it used to point at a README that did not
say)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures import START_SERVICES, TOOL_PACKAGES, missing_tool

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test-deps.sh"
BASH = shutil.which("bash") or "/bin/bash"


def test_make_test_runs_the_script_that_installs_the_test_tools() -> None:
    makefile = (ROOT / "Makefile").read_text()

    test_target = re.search(r"^test:(.*)$", makefile, re.MULTILINE)
    assert test_target is not None and "test-deps" in test_target.group(1).split()
    assert re.search(r"^test-deps:\n\tbash scripts/test-deps.sh$", makefile, re.MULTILINE)


@pytest.mark.parametrize("tool", sorted(TOOL_PACKAGES))
def test_a_skip_for_a_missing_tool_names_the_packages_and_the_script_installs_them(
    tool: str,
) -> None:
    reason = missing_tool(tool)

    assert f"apt-get install --no-install-recommends {TOOL_PACKAGES[tool]}" in reason
    assert "README" not in reason
    script = SCRIPT.read_text()
    for package in TOOL_PACKAGES[tool].split():
        assert f"need+=({package})" in script


def test_a_skip_for_a_missing_service_says_how_to_start_it() -> None:
    assert "make services" in START_SERVICES
    assert "apt-get install redis-server postgresql rabbitmq-server" in START_SERVICES


def test_the_script_installs_every_missing_tool_with_apt_get_as_root(tmp_path: Path) -> None:
    """On a PATH holding none of the tools, only an apt-get that records its arguments."""
    calls = tmp_path / "calls"
    apt = tmp_path / "apt-get"
    apt.write_text(f'#!{BASH}\necho "$@" >> {calls}\n')
    apt.chmod(0o755)
    env = {"PATH": str(tmp_path), "APT_GET": "apt-get", "HOME": str(tmp_path)}

    done = subprocess.run(
        [BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False
    )

    assert done.returncode == 0, done.stderr
    wanted = "chromium chromium-driver prometheus faketime docker-compose"
    if os.geteuid() == 0:
        lines = calls.read_text().splitlines()
        assert lines[0] == "update -qq"
        assert lines[1] == f"install -y -qq --no-install-recommends {wanted}"
    else:
        assert not calls.exists()
        assert f"sudo apt-get install --no-install-recommends {wanted}" in done.stdout


def test_the_script_does_nothing_when_every_tool_is_there(tmp_path: Path) -> None:
    for tool in ("chromium", "chromedriver", "promtool", "faketime", "docker-compose"):
        (tmp_path / tool).write_text(f"#!{BASH}\n")
        (tmp_path / tool).chmod(0o755)

    done = subprocess.run(
        [BASH, str(SCRIPT)], env={"PATH": str(tmp_path)}, capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip

    assert (done.returncode, done.stdout) == (0, "")
