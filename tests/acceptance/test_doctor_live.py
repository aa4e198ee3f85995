"""``conventions doctor`` against real workers: a lane nobody consumes is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tasks.reports import daily_sales
from tests.fixtures import ROOT, WorkerProcess

pytestmark = pytest.mark.usefixtures("clean_store")


def _doctor(*extra: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", "doctor", "--json", "--timeout", "3",
         *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def _errors(report: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {
        (f["code"], f["subject"]): f["message"] for f in report["findings"] if f["level"] == "error"
    }


def test_the_doctor_reports_the_heavy_queue_when_the_only_worker_consumes_email(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    import datetime as dt

    # what earlier tests' workers left (an unacked message, an inbox) would be given back
    # to heavy by this worker's sweep: only this test's job should wait there
    broker_redis.delete("heavy", "unacked", "unacked_index", *broker_redis.scan_iter("_cc.*"))
    worker_process("only-email", "email", 1)
    daily_sales.delay(business_date=dt.date(2031, 4, 1))  # waits: nobody consumes heavy

    status, report = _doctor()

    assert status == 1
    errors = _errors(report)
    assert ("queue-without-consumer", "heavy") in errors
    assert "reports.daily_sales.v1" in errors[("queue-without-consumer", "heavy")]
    assert "1 waiting" in errors[("queue-without-consumer", "heavy")]
    assert "-Q heavy" in errors[("queue-without-consumer", "heavy")]
    assert ("queue-without-consumer", "email") not in errors
    assert [queues for queues in report["workers"].values()] == [["email"]]
    broker_redis.delete("heavy")


def test_the_doctor_is_clean_when_a_worker_consumes_email_and_heavy(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    worker_process("both-lanes", "email,heavy", 1)

    status, report = _doctor()

    assert _errors(report) == {}
    assert status == 0 and report["ok"] is True
    assert [queues for queues in report["workers"].values()] == [["email", "heavy"]]
