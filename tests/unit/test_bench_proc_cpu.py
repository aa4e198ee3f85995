"""bench.proc_cpu: the CPU per job of a worker's main process, its pool and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from bench import proc_cpu


def test_the_pool_is_the_processes_whose_parent_is_the_worker() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in proc_cpu.children(os.getpid())
        assert os.getpid() not in proc_cpu.children(child.pid)
        parts = proc_cpu.snapshot(os.getpid(), None)
        assert set(parts) == {"main", "pool"}  # no Redis here: absent, not zero
        assert parts["main"] > 0
    finally:
        child.kill()
        child.wait()


class _Answers:
    """A client whose INFO names a process of this machine that is not a Redis."""

    def info(self, section: str) -> dict[str, Any]:
        assert section == "server"
        return {"process_id": os.getpid()}


def test_a_redis_pid_that_is_not_a_redis_server_here_is_left_out() -> None:
    assert proc_cpu.redis_pid(_Answers()) is None


def test_per_job_medians_and_totals_keep_only_the_parts_read() -> None:
    before = {"main": 1.0, "pool": 2.0, "redis": 3.0}
    after = {"main": 1.5, "pool": 3.0}  # Redis could not be read the second time
    assert proc_cpu.per_job(before, after, 1000) == {"main": 500.0, "pool": 1000.0}
    assert proc_cpu.per_job(before, after, 0) == {}
    slices = [{"main": 500.0, "pool": 1000.0}, {"main": 700.0, "pool": 900.0, "redis": 100.0}]
    medians = proc_cpu.medians(slices)
    assert medians == {"main": 600.0, "pool": 950.0, "redis": 100.0}
    assert proc_cpu.total(medians) == 1650.0
    assert proc_cpu.shown(medians) == "main 600, pool 950, redis 100 us"
