"""The distribution as a user gets it: one wheel and one sdist built per session, one
fresh venv with the wheel installed (the core only, no extra), and a copy of
``examples/project`` (a project with its own ``tasks`` and ``celeryconfig``) to run in it.

The venv is made with ``python -m venv`` and the wheel installed with pip from the
package index (or pip's cache); nothing of this repository is on its path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "project"
#: the modules of the extras: none may be imported by the core
OPTIONAL = (
    "sqlalchemy",
    "psycopg",
    "sentry_sdk",
    "flower",
    "tornado",
    "prometheus_client",
    "django",
    "pytest",
    "starlette",
    "jinja2",
    "uvicorn",
    "opentelemetry",
)
#: variables of this suite (or of a developer's shell) that must not reach the venv's
#: processes: they would point them at the repository or at the reference app's settings
LEAKY_PREFIXES = ("PYTHON", "VIRTUAL_ENV", "CELERY", "CONVENTIONS_", "EXAMPLE_", "PIP_REQUIRE")
LEAKY = {"REDIS_URL", "DATABASE_URL", "SENTRY_DSN", "SMTP_URL", "DJANGO_SETTINGS_MODULE"}


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process in the fresh venv: nothing of the suite's."""
    env = {
        k: v for k, v in os.environ.items() if k not in LEAKY and not k.startswith(LEAKY_PREFIXES)
    }
    return {**env, **(extra or {})}


def tree_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (bytecode caches aside), by relative path."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path
    #: everything ``python -m build`` printed (stdout and stderr)
    log: str

    def wheel_names(self) -> list[str]:
        with zipfile.ZipFile(self.wheel) as zf:
            return zf.namelist()

    def wheel_file(self, suffix: str) -> str:
        with zipfile.ZipFile(self.wheel) as zf:
            (name,) = [n for n in zf.namelist() if n.endswith(suffix)]
            return zf.read(name).decode()


@dataclass(frozen=True)
class Venv:
    path: Path
    #: the copy of examples/project, and its file hashes before the wheel was installed
    project: Path
    project_before: dict[str, str]
    wheel: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def run(
        self, *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args],
            cwd=cwd,
            env=clean_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def python_code(
        self, code: str, *, cwd: Path, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.python), "-c", code, cwd=cwd, env=env)

    def pip(self, *args: str) -> None:
        """pip on this venv: the test run's own pip (``--python``), so that the venv is
        made without one (``ensurepip`` took seconds per venv); what it installs, and
        where, is what the venv's own pip would install."""
        done = self.run(
            sys.executable, "-m", "pip", "--python", str(self.python),
            "--disable-pip-version-check", "--no-input", *args, cwd=self.path, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist, and the wheel built from it (``python -m build``), once per run: the
    first xdist worker to need them builds them under a lock, in a folder the run's
    workers share, and the others take them (two builds at once would race on the
    ``egg-info`` the sdist step writes into the checkout)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # no xdist: the session is the run
        return _build(tmp_path_factory.mktemp("dist"))
    out = tmp_path_factory.getbasetemp().parent / f"dist-{run}"
    out.mkdir(exist_ok=True)
    with (out.parent / f"dist-{run}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = out / "build.log"
        if log.exists():
            (wheel,) = out.glob("*.whl")
            (sdist,) = out.glob("*.tar.gz")
            return Built(wheel=wheel, sdist=sdist, log=log.read_text())
        made = _build(out)
        log.write_text(made.log)
        return made


def _build(out: Path) -> Built:
    # PYTHONDONTWRITEBYTECODE makes distutils print a "byte-compiling is disabled" warning
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        cwd=out, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"python -m build failed:\n{log}"
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Built(wheel=wheel, sdist=sdist, log=log)


def venv_beside(source: Path, base: Path, built: Built, extras: str = "") -> Venv:
    """A fresh venv with the wheel installed (``extras``: ``"[sql,testing]"``), beside a
    copy of the project ``source`` whose files were hashed before the install."""
    project = base / source.name
    shutil.copytree(source, project, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    before = tree_hashes(project)
    path = base / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    env = Venv(path=path, project=project, project_before=before, wheel=built.wheel)
    env.pip("install", "-q", f"{built.wheel}{extras}")
    return env


@pytest.fixture(scope="session")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv with the wheel installed (no extra), beside a copy of the example
    project whose files were hashed before the install."""
    return venv_beside(PROJECT, tmp_path_factory.mktemp("user"), built)


def redis_url(client: redis.Redis) -> str:
    """The URL of ``client``'s database (one of this run's own: tests/fixtures.py)."""
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw['db']}"


@pytest.fixture(scope="session")
def example_env(broker_redis: redis.Redis, store_redis: redis.Redis) -> dict[str, str]:
    """What the example project's celeryconfig reads: this run's own Redis databases
    (TEST_BROKER_DB, TEST_STORE_DB), emptied before and after the session."""
    return {
        "EXAMPLE_BROKER_URL": redis_url(broker_redis),
        "EXAMPLE_STORE_URL": redis_url(store_redis),
        "EXAMPLE_THROWAWAY_REDIS": "1",  # the suite's Redis keeps nothing on disk
    }
