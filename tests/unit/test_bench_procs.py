"""Two benchmarks at once keep their own worker logs and ready files: each run (each
``python -m bench`` process) gets a folder of its own under ``/tmp/cc-bench``. Before,
both wrote ``/tmp/cc-bench/<worker>.ready``: one bench's worker could be taken as ready
by the other's file, or have its file deleted by the other's start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import procs

ASK = "from bench import procs; print(procs.run_dir()); print(procs.run_dir())"


def test_each_run_has_its_own_folder_and_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "TMPDIR": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True, check=True,
                       env=env, timeout=60).stdout.split()
        for _ in range(2)
    ]  # fmt: skip

    (first, again), (second, _) = runs
    assert first == again, "one run keeps one folder"
    assert first != second, "two runs at once never share one"
    assert Path(first).parent == Path(second).parent == tmp_path / "cc-bench"


def test_a_workers_ready_file_and_log_are_in_the_runs_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "LOG_DIR", tmp_path)
    monkeypatch.setattr(procs, "_run_dir", None)
    worker = procs.Worker("w1", [sys.executable, "-c", "pass"], ready=procs.run_dir() / "w1.ready")
    worker.stop()

    assert worker.log.parent == worker.ready.parent == procs.run_dir()  # type: ignore[union-attr]
    assert procs.run_dir().parent == tmp_path
