"""Worker subprocesses for the benchmarks: a Celery worker (through :mod:`bench.launch`)
or a peer's own worker command, each started once, kept up, and stopped at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import common

#: where each run's folder of worker logs and ready files goes (kept after the run for a
#: look)
LOG_DIR = Path(tempfile.gettempdir()) / "cc-bench"
_run_dir: Path | None = None


def run_dir() -> Path:
    """This run's own folder under :data:`LOG_DIR` (made at its first use, the same for
    the rest of the process): two benchmarks at once never share a worker's log or ready
    file (``fleet-w1.ready`` of one is not the other's)."""
    global _run_dir  # noqa: PLW0603 (one folder per process)
    if _run_dir is None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        _run_dir = Path(tempfile.mkdtemp(prefix=time.strftime("run-%Y%m%d-%H%M%S-"), dir=LOG_DIR))
    return _run_dir


class Worker:
    """One worker subprocess in its own session (so that its children stop with it)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        ready: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``env``: the subprocess's environment (the benchmark's, :func:`common.env`,
        when None)."""
        self.name = name
        self.log = run_dir() / f"{name}.log"
        self.ready = ready
        if ready is not None:
            ready.unlink(missing_ok=True)
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            list(argv),
            cwd=common.ROOT,
            env=common.env() if env is None else env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 90, marker: bytes | None = None) -> None:
        """Until the ready file exists (or ``marker`` is in the log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready is not None and self.ready.exists():
                return
            if marker is not None and marker in self.log.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} not ready:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def errors(self) -> list[str]:
        """Log lines that report an error or a traceback (a drain must have none)."""
        return [
            line
            for line in self.output().splitlines()
            if "ERROR" in line or "Traceback" in line or "CRITICAL" in line
        ]

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def celery_worker(
    name: str,
    app: str,
    queue: str,
    *,
    pool: str = "prefork",
    concurrency: int = 2,
    launch: Sequence[str] = (),
) -> Worker:
    """``celery -A app worker -P pool -c concurrency -Q queue`` through :mod:`bench.launch`."""
    ready = run_dir() / f"{name}.ready"
    argv = [
        common.python(), "-m", "bench.launch", *launch, "--ready", str(ready), "--",
        "-A", app, "worker", "-P", pool, "-c", str(concurrency), "-Q", queue,
        "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=WARNING",
    ]  # fmt: skip
    return Worker(name, argv, ready)
