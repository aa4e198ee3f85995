"""A real ``conventions metrics serve`` subprocess, and its scrapes parsed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures import ROOT
from tests.isolation import free_port

#: (sample name, queue, task) -> value; labels the sample lacks are ""
Scrape = dict[tuple[str, str, str], float]


class ExporterProcess:
    """``python -m conventions -A APP metrics serve`` on a free port.

    ``addr``: the ``--addr`` given (None: none, the exporter's default or the app's
    setting); ``host``: where the scrapes go; ``env``: variables added to the process's.
    """

    def __init__(
        self,
        app: str,
        log: Path,
        *extra: str,
        addr: str | None = "127.0.0.1",
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.host = host
        self.log = log
        self._out = log.open("wb")
        bind = ["--addr", addr] if addr is not None else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conventions", "-A", app, "metrics", "serve", *bind,
             "--port", str(self.port), "--consumers-every", "1", *extra],
            cwd=ROOT, env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
            stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def __enter__(self) -> ExporterProcess:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the exporter exited:\n{self.log.read_text()}")
            try:
                self.text()
                return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"the exporter did not answer:\n{self.log.read_text()}")

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()

    def text(self) -> str:
        url = f"http://{self.host}:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            return str(response.read().decode())

    def scrape(self) -> Scrape:
        """Every sample of one real scrape of ``/metrics``."""
        out: Scrape = {}
        for family in text_string_to_metric_families(self.text()):
            for sample in family.samples:
                labels = sample.labels
                if set(labels) - {"queue", "task", "le"}:
                    raise AssertionError(f"{sample.name} has labels beyond queue and task")
                name = f"{sample.name}{{le={labels['le']}}}" if "le" in labels else sample.name
                out[name, labels.get("queue", ""), labels.get("task", "")] = sample.value
        return out
