"""The result files the benchmarks keep in the repository, and what each says of its run.

``python -m bench --json bench/results/bench.json`` and ``python -m bench.scale --out
bench/results/scale.json`` write them; ``python -m bench.docs`` makes the docs' tables
from them. Each file carries the run it came from (:func:`meta`): the command, the
commit, the date, the machine's cores, its load average and the share of its CPU time the
hypervisor took while the run went on (``steal`` in ``/proc/stat``), so that a table says
which run it shows and how noisy the machine was.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
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
    # the result files themselves are not the code that made them
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "conventions", "bench",
                ":!bench/results")  # fmt: skip
    return f"{head}-dirty" if dirty else head


#: the share of the run's CPU time the hypervisor may take before the run counts as noisy
#: (a virtual machine whose host is busy: 7-12% was seen with an ordinary load average)
STEAL_NOISY = 0.02


#: the kernel's CPU accounting: the ``cpu`` line's ticks since boot
PROC_STAT = Path("/proc/stat")


def cpu_ticks(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """The machine's (steal, total) CPU ticks since boot, from the ``cpu`` line of
    ``/proc/stat``; None where there is no such file (not Linux)."""
    try:
        line = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not line or line[0] != "cpu":
        return None
    ticks = [int(x) for x in line[1:9]]
    steal = ticks[7] if len(ticks) > 7 else 0
    return steal, sum(ticks)


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the CPU time between two readings that the hypervisor took."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round((end[0] - start[0]) / (end[1] - start[1]), 4)


def load(stat: Path = PROC_STAT) -> dict[str, Any]:
    """The machine's load now: the 1/5/15-minute averages, the cores they share and the
    CPU ticks (read from ``stat``) a later reading takes the run's steal from."""
    one, five, fifteen = os.getloadavg()
    cores = os.cpu_count() or 1
    return {
        "average": [round(one, 2), round(five, 2), round(fifteen, 2)],
        "cores": cores,
        "quiet": max(one, five) < 0.5 * cores,
        "ticks": cpu_ticks(stat),
    }


def meta(
    command: str, load_at_start: dict[str, Any] | None = None, stat: Path = PROC_STAT
) -> dict[str, Any]:
    """What a result file says of its run. ``quiet`` is False when the load average was at
    or above half the cores at the start (something else ran), or when the hypervisor took
    ``STEAL_NOISY`` or more of the CPU time during the run: its figures are then noisy.
    The load at the end is kept but not judged: the bench's own workers raise it.
    ``stat``: where the CPU ticks are read (``/proc/stat``)."""
    end = load(stat)
    start = load_at_start or end
    steal = steal_share(start.get("ticks"), end.get("ticks"))
    return {
        "command": command,
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cores": end["cores"],
        "load": {
            "start": start["average"],
            "end": end["average"],
            "steal": steal,
            "quiet": bool(start["quiet"] and (steal is None or steal < STEAL_NOISY)),
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


#: how often :func:`settle` reads the load average
SETTLE_POLL = 5.0


def settle(seconds: float, poll: float = SETTLE_POLL) -> dict[str, Any]:
    """Wait up to ``seconds`` for the machine to be quiet (:func:`load`: the 1- and
    5-minute load averages below half the cores; a run right after another starts with
    that run's workers still in the 5-minute average), then give the load to start from.
    A machine still busy after ``seconds`` is measured anyway, and its run says so."""
    deadline = time.monotonic() + max(0.0, seconds)
    found = load()
    while not found["quiet"] and time.monotonic() < deadline:
        print(f"# settling: load average {found['average']}, {found['cores']} cores",
              file=sys.stderr, flush=True)  # fmt: skip
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        found = load()
    return found
