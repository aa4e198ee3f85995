"""A release's runtime: its wheel, built from its commit, installed in a venv of its own.

The mixed-fleet tests run workers and publishers of a tagged release beside HEAD's. The
release's code comes from git (``git archive <sha>``, so no checkout is touched), its
wheel is built by ``python -m build --wheel`` and installed with the ``sql`` extra into a
fresh ``python -m venv``, its dependencies pinned to the versions HEAD's environment runs
(``pip freeze`` as constraints, from this machine's package index or pip's cache). A venv
of its own rather than shared site-packages: the old ``conventions`` must be the only one
its processes can import, and a fleet's old pods run their own dependency set too (the
pins keep the comparison about the layer, not about a Celery upgrade).

Built once per commit (and per HEAD's pins) under ``$CONVENTIONS_RELEASE_CACHE`` (default:
the system's temporary folder), behind a file lock, so several tests, sessions and
worktrees share one build; a half-built runtime (no stamp) is built again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance.releases import ROOT, commit_of
from tests.packaging.conftest import clean_env

#: what a finished runtime's folder holds, written last
STAMP = "runtime.ok"


@dataclass(frozen=True)
class Runtime:
    """A Python that imports one version of the layer."""

    #: ``"v0.1.0"``, or ``"HEAD"`` for this checkout
    name: str
    python: Path

    @property
    def celery(self) -> list[str]:
        """The command that runs this runtime's ``celery``."""
        return [str(self.python), "-m", "celery"]


#: this checkout's runtime: the test's own interpreter (the layer installed editable)
HEAD = Runtime("HEAD", Path(sys.executable))


def _cache_root() -> Path:
    return Path(os.environ.get("CONVENTIONS_RELEASE_CACHE") or tempfile.gettempdir()) / (
        "cc-release-runtimes"
    )


def _pins() -> str:
    """HEAD's environment as constraints: every distribution but the layer itself."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    lines = [
        line for line in frozen.stdout.splitlines()
        if line and not line.startswith(("#", "-e", "celery-conventions", "celery_conventions"))
    ]  # fmt: skip
    return "\n".join(sorted(lines)) + "\n"


def _run(args: list[str], cwd: Path, timeout: float = 600) -> None:
    # PYTHONDONTWRITEBYTECODE makes the build print a warning; the rest of the suite's
    # environment (CELERY_*, CONVENTIONS_*, PYTHONPATH) must not reach the build or the venv
    env = {k: v for k, v in clean_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}"


def _build(sha: str, folder: Path, pins: str) -> None:
    """Source, wheel, venv, install, check: into ``folder`` (emptied first)."""
    shutil.rmtree(folder, ignore_errors=True)
    source, dist, venv = folder / "src", folder / "dist", folder / "venv"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", sha],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)], folder)
    (wheel,) = dist.glob("*.whl")
    (folder / "pins.txt").write_text(pins)
    _run([sys.executable, "-m", "venv", str(venv)], folder)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
          "-c", str(folder / "pins.txt"), f"{wheel}[sql]"], folder)  # fmt: skip
    where = subprocess.run(
        [str(python), "-c", "import conventions; print(conventions.__file__)"],
        cwd=folder, env=clean_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    (folder / STAMP).write_text(f"{sha}\n{wheel.name}\n")


def release_runtime(tag: str) -> Runtime:
    """The runtime of release ``tag`` (built on first use, then shared)."""
    sha = commit_of(tag)
    pins = _pins()
    key = f"{sha[:12]}-{hashlib.sha256(pins.encode()).hexdigest()[:8]}"
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / key
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / STAMP).exists():
            _build(sha, folder, pins)
    return Runtime(tag, folder / "venv" / "bin" / "python")
