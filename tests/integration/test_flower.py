"""Flower with the reliable profile: it sees our jobs, shows their correlation ids, and
keeps everything but ``/metrics`` and ``/healthcheck`` behind its basic auth."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conventions import bind
from tests.fixtures import ROOT
from tests.integration import support_metrics
from tests.integration.helpers import wait_for
from tests.isolation import free_port

pytestmark = pytest.mark.usefixtures("clean_store")

CREDENTIALS = "ops:s3cret"


@pytest.fixture
def flower(services: None, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = tmp_path / "flower.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}",
             "--address=127.0.0.1", f"--basic-auth={CREDENTIALS}"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _status(f"{url}/healthcheck") == 200, timeout=60, every=0.3)
            yield url
        finally:
            proc.terminate()
            proc.wait(20)


def _status(url: str, auth: str | None = None) -> int | None:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", f"Basic {base64.b64encode(auth.encode()).decode()}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _tasks(url: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/api/tasks")
    token = base64.b64encode(CREDENTIALS.encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


def test_flower_shows_a_jobs_correlation_id_and_guards_all_but_metrics(
    flower: str, worker_process: Callable[..., Any]
) -> None:
    worker_process("flowered", "email", include="tests.integration.support_metrics")
    # Flower answers before its event consumer is connected: wait until it saw a job
    warm_up = support_metrics.metered.delay(item_id="flower_warm_up")
    wait_for(lambda: _tasks(flower).get(warm_up.id), timeout=30, every=0.5)
    with bind(correlation_id="corr-flower-1"):
        handle = support_metrics.metered.delay(item_id="flower_1")
    assert handle.get(timeout=30) == "ok"

    def seen() -> dict[str, Any] | None:
        task = _tasks(flower).get(handle.id)
        return task if task and task.get("state") == "SUCCESS" else None

    task = wait_for(seen, timeout=30, every=0.5)
    assert task["name"] == "testing.metered.v1"
    assert "'~correlation': 'corr-flower-1'" in task["kwargs"]
    assert _status(f"{flower}/api/tasks") == 401  # no credentials
    assert _status(f"{flower}/") == 401
    assert _status(f"{flower}/metrics") == 200  # open: a proxy must guard it
