"""Raw Celery apps for the benchmarks: no ``conventions`` import anywhere in the process.

``raw`` carries the same reliability settings as ``celeryconfig`` (a unit test
checks that they stay equal); ``default`` is Celery as it comes: early acks, prefetch 4,
no result backend, no events; ``raw_tuned`` is ``raw`` with the options of the convention
variant ``tuned`` (no results, no STARTED state, no sent event, prefetch 4). The task
takes the same id-only keyword argument as the convention task and does nothing.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from kombu import Queue

from bench import common

#: the reliable profile of ``celeryconfig`` (routing and the layer's own settings aside)
RELIABLE: dict[str, Any] = {
    "result_expires": 86400,
    "result_extended": True,
    "result_backend_always_retry": True,
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    "worker_cancel_long_running_tasks_on_connection_loss": False,
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "task_send_sent_event": True,
    "worker_send_task_events": True,
    "task_track_started": True,
    "worker_soft_shutdown_timeout": 10.0,
    "worker_enable_soft_shutdown_on_idle": False,
    "task_time_limit": 300,
    "task_soft_time_limit": 270,
    "enable_utc": True,
    "timezone": "UTC",
}


def url() -> str:
    """The benchmark's Redis (``REDIS_URL``, set by the harness for its subprocesses)."""
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")


def queue(variant: str) -> str:
    return f"bench_{variant}"


def make(variant: str, settings: dict[str, Any] | None) -> Celery:
    """A raw app: with ``settings`` (and a result backend), or Celery's defaults."""
    name = f"bench_{variant}"
    if settings is None:
        app = Celery(name, broker=url())
        app.conf.task_default_queue = queue(variant)
    else:
        app = Celery(name, broker=url(), backend=url())
        app.conf.update(
            broker_transport_options={"visibility_timeout": 4800},
            task_queues=(Queue(queue(variant)),),
            task_default_queue=queue(variant),
            task_create_missing_queues=False,
            **settings,
        )

    @app.task(name=f"bench.noop_{variant}", shared=False)  # type: ignore[untyped-decorator]
    def noop(order_id: str) -> None:
        """Nothing, like the convention task's body."""

    return app


raw = make("raw", RELIABLE)
default = make("default", None)
raw_tuned = make("raw_tuned", {**RELIABLE, **common.TUNED})
