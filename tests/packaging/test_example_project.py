"""The wheel installed beside a project with its own ``tasks`` and ``celeryconfig``
(``examples/project``), in a fresh venv: the project's modules are the ones imported, its
files are untouched by install and uninstall, and a real worker started from the venv runs
its convention job, deduplicating a second publish with the same key."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.packaging.conftest import Venv, clean_env, tree_hashes

WHERE = """
import json, celeryconfig, conventions, tasks
print(json.dumps({
    "tasks": tasks.__file__, "celeryconfig": celeryconfig.__file__,
    "conventions": conventions.__file__, "app": tasks.app.main,
    "jobs": sorted(n for n in tasks.app.tasks if not n.startswith("celery.")),
}))
"""


def test_the_projects_own_tasks_and_celeryconfig_are_the_ones_imported(venv: Venv) -> None:
    done = venv.python_code(WHERE, cwd=venv.project)
    assert done.returncode == 0, done.stderr
    where = json.loads(done.stdout)
    assert Path(where["tasks"]) == venv.project / "tasks" / "__init__.py"
    assert Path(where["celeryconfig"]) == venv.project / "celeryconfig.py"
    assert Path(where["conventions"]).is_relative_to(venv.path)  # the wheel's, in site-packages
    assert where["app"] == "example_project"
    assert "accounts.send_welcome.v1" in where["jobs"]


def test_the_wheel_installs_no_tasks_and_no_celeryconfig(venv: Venv, tmp_path: Path) -> None:
    """Outside the project's folder there is no ``tasks`` and no ``celeryconfig`` to import:
    a missing config can never load the reference app's."""
    for module in ("tasks", "celeryconfig"):
        done = venv.python_code(f"import {module}", cwd=tmp_path)
        assert done.returncode == 1
        assert f"No module named '{module}'" in done.stderr
    site = venv.python_code(
        "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
    )
    installed = {p.name for p in Path(site.stdout.strip()).iterdir()}
    assert {"tasks", "celeryconfig.py"} & installed == set()
    assert "conventions" in installed


def test_installing_the_wheel_changed_no_file_of_the_project(venv: Venv) -> None:
    assert tree_hashes(venv.project) == venv.project_before


def test_uninstalling_the_layer_leaves_every_file_of_the_project(venv: Venv) -> None:
    try:
        venv.pip("uninstall", "-y", "celery-conventions")
        assert tree_hashes(venv.project) == venv.project_before
        gone = venv.python_code("import conventions", cwd=venv.path)
        assert "No module named 'conventions'" in gone.stderr
        # the project's package is still there and still its own (its app needs the
        # layer, so import the package's folder without running the app)
        found = venv.python_code(
            "import importlib.util; print(importlib.util.find_spec('tasks').origin)",
            cwd=venv.project,
        )
        assert Path(found.stdout.strip()) == venv.project / "tasks" / "__init__.py"
    finally:  # the venv is the session's: give the other tests their layer back
        venv.pip("install", "-q", "--no-deps", str(venv.wheel))
    done = venv.python_code("import tasks; print(tasks.__file__)", cwd=venv.project)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == venv.project / "tasks" / "__init__.py"


def test_the_project_type_checks_against_the_installed_wheel(venv: Venv, tmp_path: Path) -> None:
    """mypy strict on the project, seeing the layer only as the wheel installed it: its
    ``py.typed`` makes ``Payload``, ``App.job`` and ``JobContext`` typed for the user."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(venv.python),
         "--cache-dir", str(tmp_path / "mypy-cache")],
        cwd=venv.project, env=clean_env(), capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found in 3 source files" in done.stdout


PUBLISH = """
import json, sys
from tasks.welcome import send_welcome
account = sys.argv[1]
first = send_welcome.delay(account_id=account)
value = first.get(timeout=30)
second = send_welcome.delay(account_id=account)
print(json.dumps({
    "value": value, "first": first.id, "first_dedup": first.deduplicated,
    "second": second.id, "second_dedup": second.deduplicated,
}))
"""


def test_a_worker_from_the_venv_runs_the_projects_job_once(
    venv: Venv, example_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                str(venv.bin / "celery"), "-A", "tasks", "worker", "-Q", "example",
                "-c", "1", "-P", "prefork", "-n", f"dist-{uuid.uuid4().hex[:6]}@%h",
                "--without-gossip", "--without-mingle", "--loglevel=INFO",
            ],
            cwd=venv.project, env=clean_env(example_env), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b" ready." not in log.read_bytes():
            assert worker.poll() is None, f"the worker exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the worker is not ready:\n{log.read_text()}"
            time.sleep(0.2)
        account = f"a-{uuid.uuid4().hex[:8]}"
        done = venv.run(str(venv.python), "-c", PUBLISH, account, cwd=venv.project, env=example_env)
        assert done.returncode == 0, f"{done.stderr}\nworker:\n{log.read_text()}"
        result = json.loads(done.stdout)
        assert result["value"].startswith(f"welcome sent to {account}")
        assert result["first_dedup"] is False
        assert result["second_dedup"] is True  # the same key: nothing was published again
        assert result["second"] == result["first"]
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
            raise
    text = log.read_text()
    assert code == 0, text
    assert text.count("accounts.send_welcome.v1[") and text.count("succeeded in") == 1, text
