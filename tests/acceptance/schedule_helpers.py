"""Real ``celery -A tasks beat`` subprocesses for the schedule tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conventions.schedules.entries import Entry
from conventions.store.records import AuditEvent
from tests.fixtures import ROOT


class BeatProcess:
    """One beat with its own schedule file."""

    def __init__(self, name: str, tmp: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "tasks", "beat",
                "-s", str(tmp / f"{name}-schedule"), "--loglevel=INFO",
            ],
            cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"beat: Starting" in self.log.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"beat {self.name} exited:\n{self.output()}")
            time.sleep(0.2)
        raise TimeoutError(f"beat {self.name} not ready:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


@pytest.fixture
def beat_process(services: None, tmp_path: Path) -> Iterator[Callable[..., BeatProcess]]:
    """Start real beat subprocesses: ``beat_process("b1", CONVENTIONS_SCHEDULE=...)``."""
    started: list[BeatProcess] = []

    def start(name: str, **env: str) -> BeatProcess:
        beat = BeatProcess(name, tmp_path, {**os.environ, **env, "PYTHONPATH": str(ROOT)})
        started.append(beat)
        beat.wait_ready()
        return beat

    yield start
    for beat in started:
        beat.stop()


def trail(entry: Entry, label_at: object) -> list[AuditEvent]:
    """The audit trail of one occurrence of ``entry`` (its own correlation id)."""
    from tasks import app

    occurrence = entry.occurrence(label_at)  # type: ignore[arg-type]
    return app.store.audit_for(occurrence.correlation_id)


def names(events: list[AuditEvent]) -> list[str]:
    return [event.event for event in events]
