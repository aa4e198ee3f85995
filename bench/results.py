"""The result files the benchmarks keep in the repository, and what each says of its run.

``python -m bench --json bench/results/bench.json`` and ``python -m bench.scale --out
bench/results/scale.json`` write them; ``python -m bench.docs`` makes the docs' tables
from them. Each file carries the run it came from (:func:`meta`): the command, the
commit, the date, the machine's cores and its load average, so that a table says which
run it shows and how noisy the machine was.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

#: the folder of the kept result files
FOLDER = Path(__file__).resolve().parent / "results"
#: the main run's file (``python -m bench --json``) and the cost count's (``bench.scale``)
BENCH = FOLDER / "bench.json"
SCALE = FOLDER / "scale.json"


def commit() -> str:
    """The checked-out commit (``git rev-parse HEAD``), ``-dirty`` when files differ."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "conventions", "bench")
    return f"{head}-dirty" if dirty else head


def load() -> dict[str, Any]:
    """The machine's load now: the 1/5/15-minute averages and the cores they share."""
    one, five, fifteen = os.getloadavg()
    cores = os.cpu_count() or 1
    return {
        "average": [round(one, 2), round(five, 2), round(fifteen, 2)],
        "cores": cores,
        "quiet": max(one, five) < 0.5 * cores,
    }


def meta(command: str, load_at_start: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a result file says of its run. ``quiet`` is False when the load average was at
    or above half the cores at the start or the end: its CPU figures are then noisy."""
    end = load()
    start = load_at_start or end
    return {
        "command": command,
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cores": end["cores"],
        "load": {
            "start": start["average"],
            "end": end["average"],
            "quiet": bool(start["quiet"] and end["quiet"]),
        },
        "python": platform.python_version(),
    }


def write(path: Path, data: dict[str, Any]) -> None:
    """One result file, indented, keys in a stable order (a diff shows what moved)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
