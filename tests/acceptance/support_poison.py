"""A test-only job that kills its own worker process every time it runs (a poison pill:
think of a segfaulting C extension or an out-of-memory kill). Imported by the poison
test's worker through ``--include``."""

from __future__ import annotations

import os
import signal

from conventions import Id, JobContext, Payload
from tasks import app


class KillWorker(Payload):
    """Which pill."""

    pill_id: Id


@app.job(
    "testing.kill_worker.v1", payload=KillWorker, key="kill-worker:{pill_id}", workload="email"
)
def kill_worker(payload: KillWorker, ctx: JobContext) -> None:
    """SIGKILL the pool process running this job, on every delivery."""
    os.kill(os.getpid(), signal.SIGKILL)
