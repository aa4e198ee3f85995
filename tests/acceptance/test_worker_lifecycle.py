"""A worker's start and stop, through real ``celery -A tasks worker`` processes.

Stop: SIGTERM to the main process. Running jobs see ``ctx.is_stopping()`` turn true
in the prefork children; a job that ignores it is cancelled when the grace is over and
its message goes back to the queue (never lost), where the next worker runs it.
Start: the doctor refuses a worker whose configuration is dangerous.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
import redis

from tests.acceptance import support_lifecycle as jobs
from tests.fixtures import WorkerProcess
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

INCLUDE = "tests.integration.support_jobs,tests.acceptance.support_lifecycle"
GRACE = 2.0
#: Celery's soft shutdown window after the grace (``worker_soft_shutdown_timeout``)
SOFT_SHUTDOWN = 10.0


# 17 s of a real grace period: in make chaos (make test's 20 minutes)
@pytest.mark.chaos
def test_a_job_that_ignores_the_stop_is_cancelled_after_the_grace_and_runs_again_elsewhere(
    worker_process: Callable[..., WorkerProcess],
    broker_redis: redis.Redis,
    store_redis: redis.Redis,
) -> None:
    broker_redis.delete("email")
    old = worker_process(
        "grace-old", "email", 2, include=INCLUDE, CONVENTIONS_SHUTDOWN_GRACE=str(GRACE)
    )
    job = jobs.stubborn.delay(call_id="deploy_1")
    wait_for(lambda: store_redis.get(jobs.STUBBORN_RUNS + "deploy_1") == "1", timeout=30)

    sent = time.monotonic()
    old.proc.send_signal(signal.SIGTERM)
    # the child process running the job sees the stop the main process received
    wait_for(lambda: store_redis.get(jobs.STUBBORN_SAW_STOP + "deploy_1"), timeout=10)
    old.proc.wait(GRACE + SOFT_SHUTDOWN + 30)
    took = time.monotonic() - sent
    assert took >= GRACE, "the running job got its grace"
    assert "shutdown grace of 2s is over with 1 job(s) running" in old.output()
    # cancelled, never acked: the message is back in the queue
    assert broker_redis.llen("email") == 1

    store_redis.set(jobs.STUBBORN_RELEASE + "deploy_1", "1")
    worker_process("grace-new", "email", 2, include=INCLUDE)
    assert job.get(timeout=60) == "released"
    assert store_redis.get(jobs.STUBBORN_RUNS + "deploy_1") == "2"
    print(f"\ngrace: worker exited {took:.1f}s after SIGTERM (grace {GRACE}s)")


def test_the_doctor_refuses_to_start_a_worker_whose_visibility_timeout_is_below_its_time_limits(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    with pytest.raises(RuntimeError, match="exited") as refused:
        worker_process(
            "refused", "email", 1, CONVENTIONS_VISIBILITY_TIMEOUT="30", CONVENTIONS_DOCTOR_LEVELS=""
        )
    message = str(refused.value)
    assert "conventions doctor refuses to start this worker" in message
    assert "time-limit-beyond-visibility" in message
    assert "raise broker_transport_options['visibility_timeout']" in message
