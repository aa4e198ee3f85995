"""A project that is not installed: its tests cannot import its ``tasks`` unless pytest
puts the project's root on the path. The kit's plugin says so, naming the setting, both
where a test module imports the app and where the ``cc_app`` fixture does; with the
setting, the same project runs. A real pytest process on a project of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: a hang guard only: these runs take a second
HANG_GUARD = 60.0
PYTEST = str(Path(sys.executable).parent / "pytest")
HINT = 'pythonpath = ["."] in the [tool.pytest.ini_options]'


def project(root: Path, pythonpath: bool) -> Path:
    """A shop laid out as the guide shows: ``tasks/``, ``tests/``, ``pyproject.toml``."""
    (root / "tasks").mkdir()
    (root / "tests").mkdir()
    (root / "tasks" / "__init__.py").write_text("app = 'the shop app'\n")
    (root / "tests" / "test_imports.py").write_text(
        "from tasks import app\n\n\ndef test_app() -> None:\n    assert app\n"
    )
    (root / "tests" / "test_fixture.py").write_text(
        "def test_cc_app(cc_app: str) -> None:\n    assert cc_app == 'the shop app'\n"
    )
    path = 'pythonpath = ["."]\n' if pythonpath else ""
    (root / "pyproject.toml").write_text(f'[tool.pytest.ini_options]\ncc_app = "tasks:app"\n{path}')
    return root


def pytest_in(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``pytest`` command (not ``python -m pytest``, which puts the working directory
    on the path) in ``root``, with the kit's plugin."""
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [PYTEST, "-p", "conventions", "-p", "no:cacheprovider", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=HANG_GUARD, check=False,
    )  # fmt: skip


def test_a_project_that_cannot_import_its_app_is_told_to_set_pythonpath(
    tmp_path: Path,
) -> None:
    """Both ways in: a test module's ``from tasks import app`` (collection) and the
    ``cc_app`` fixture (setup)."""
    done = pytest_in(project(tmp_path, pythonpath=False), "--continue-on-collection-errors")

    assert done.returncode != 0
    assert "No module named 'tasks'" in done.stdout
    assert "ERROR collecting tests/test_imports.py" in done.stdout
    assert done.stdout.count(HINT) >= 2, done.stdout  # beside the collection error and in setup
    assert "cannot be imported" in done.stdout


def test_with_pythonpath_set_the_project_runs_uninstalled(tmp_path: Path) -> None:
    done = pytest_in(project(tmp_path, pythonpath=True))

    assert done.returncode == 0, done.stdout
    assert "2 passed" in done.stdout
