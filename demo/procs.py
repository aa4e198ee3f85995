"""The demo's processes: each started in a process group of its own, all stopped at the end.

Every process gets its own session (``start_new_session``), so a worker's pool children
share their parent's group. ``stop_all`` sends SIGTERM to each main process (the workers
finish what they run and stop their pool; beat and the relay finish their batch), waits,
then SIGKILLs whatever is left in each group. It runs in a ``finally``, so an exception
or a Ctrl-C stops them too. Each process's output goes to ``.demo/logs/<name>.log``; the
groups' ids go to ``.demo/pids.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: how long a process gets after SIGTERM before its whole group is killed (seconds)
STOP_GRACE = 25.0


class Fleet:
    """The processes started so far, by name, in start order."""

    def __init__(self, data: Path, env: dict[str, str], cwd: Path) -> None:
        self.data, self.cwd = data, cwd
        self.env = {**os.environ, **env}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        (data / "logs").mkdir(parents=True, exist_ok=True)

    def log(self, name: str) -> Path:
        return self.data / "logs" / f"{name}.log"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``argv`` (``python -m ...``: this interpreter) as process ``name``."""
        with self.log(name).open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *argv],
                cwd=self.cwd,
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        groups = {n: p.pid for n, p in self.procs.items()}
        (self.data / "pids.json").write_text(json.dumps(groups))

    def wait_for(self, name: str, ready: Callable[[], bool], timeout: float = 90) -> None:
        """Wait until ``ready()``; fail with the log's tail when the process died or the
        time ran out."""
        deadline = time.monotonic() + timeout
        proc = self.procs[name]
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log(name).read_text(errors="replace")[-2000:]
                state = f"exited with {proc.returncode}" if proc.poll() is not None else "slow"
                raise RuntimeError(f"{name} did not get ready ({state}); its log ends:\n{tail}")
            time.sleep(0.1)

    def wait_for_line(self, name: str, marker: bytes, timeout: float = 90) -> None:
        self.wait_for(name, lambda: marker in self.log(name).read_bytes(), timeout)

    def cli(self, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
        """Run ``conventions -A tasks ARGV`` as a person would: (exit, stdout, stderr)."""
        done = subprocess.run(
            [sys.executable, "-m", "conventions", "-A", "tasks", *argv],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def stop_all(self) -> dict[str, float]:
        """Stop every group, the last started first; how long each took (seconds)."""
        procs = list(reversed(self.procs.items()))
        self.procs.clear()
        return _stop_groups(procs)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _stop_groups(procs: list[tuple[str, subprocess.Popen[bytes]]]) -> dict[str, float]:
    """SIGTERM to each main process (a worker then stops its own pool), wait, then SIGKILL
    whatever is left in each group; returns how long each took to stop (seconds)."""
    started = time.monotonic()
    for _, proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    took: dict[str, float] = {}
    for name, proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, started + STOP_GRACE - time.monotonic()))
        took[name] = round(time.monotonic() - started, 1)
    for _, proc in procs:  # pool children left behind, or a process that ignored SIGTERM
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    return took
