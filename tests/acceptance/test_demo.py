"""`make demo` stays true: the scenario runs to the end on the embedded default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_finishes_every_job_on_the_embedded_default() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.pop("CONVENTIONS_STORE_URL", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--embedded"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ran on the embedded default" in done.stdout
    assert "orders paid          8 of 8; receipts sent 8" in done.stdout
    assert "dead letters         {'permanent': 1}" in done.stdout
