"""Celery settings: the only place that reads the environment.

It starts from a reliable profile (every setting that differs from Celery's default is
listed with its reason in ``docs/reference/settings.md``):

* ``REDIS_URL``: broker, result backend and the layer's store (default
  ``redis://localhost:6379/0``);
* ``CELERY_BROKER_URL``: overrides the broker (``filesystem://`` selects the embedded
  default used by ``make demo`` on a bare machine);
* ``CELERY_RESULT_BACKEND``, ``CONVENTIONS_STORE_URL``: override the result backend and
  the layer's store;
* ``DATABASE_URL``: the reference shop's business database (SQLite file by default);
* ``CONVENTIONS_OUTBOX_URL``: the database of the transactional outbox the relay
  publishes (default: the shop's database, where its web code adds outbox rows);
* ``SMTP_URL``: where receipts are sent (``smtp://host:port``; unset: recorded only);
* ``SENTRY_DSN``: Sentry, when set;
* ``CONVENTIONS_LOG_FORMAT``: the worker's log lines, ``text`` (default) or ``json``;
* ``CONVENTIONS_DATA_DIR``: where the embedded default keeps its files (``.demo``);
* ``CONVENTIONS_VISIBILITY_TIMEOUT``: overrides the Redis visibility timeout (seconds; tests
  shorten it to prove that a redelivered long job does not run twice).
* ``CONVENTIONS_SHUTDOWN_GRACE``: seconds running jobs get after SIGTERM (per worker lane);
* ``CONVENTIONS_METRICS_ADDR``: where the metrics exporter listens (default ``127.0.0.1``);
* ``CONVENTIONS_DOCTOR_LEVELS``: ``code=level,...`` lowers (or raises) a doctor check;
* ``REPORTS_CHUNK_ROWS``, ``REPORTS_CHUNK_PAUSE``: the daily report's chunk size and the
  pause between chunks (seconds) that keeps it gentle on the shop database.
* ``CONVENTIONS_SCHEDULE``: ``module:attribute`` of the schedule entries beat sends and the
  watchdog checks (default: ``SCHEDULE`` below);
* ``CONVENTIONS_CLOCK_OFFSET_SECONDS``: test only, shifts the schedules' clock.
* ``CONVENTIONS_UNACKED_RESTORE_INTERVAL``, ``CONVENTIONS_UNACKED_MUTEX_EXPIRE``: how often
  (seconds) kombu sweeps a dead worker's unacked messages back, and how long a worker killed
  mid-sweep holds the sweep's mutex (kombu: ~100 s and 300 s; the chaos tests shorten both).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from conventions.jobs import routing
from conventions.schedules import entries as schedules
from conventions.schedules import watchdog

_env = os.environ

#: the folder of the embedded default (filesystem broker, SQLite store and shop)
DATA_DIR = Path(_env.get("CONVENTIONS_DATA_DIR", ".demo")).resolve()
REDIS_URL = _env.get("REDIS_URL", "redis://localhost:6379/0")
EMBEDDED = _env.get("CELERY_BROKER_URL", "").startswith("filesystem")

#: workloads -> queues: the light, latency-sensitive lane and the heavy lane
WORKLOADS = {"email": "email", "light": "email", "heavy": "heavy"}
#: hard time limits per workload (seconds); soft limits sit 10% below
WORKLOAD_TIME_LIMITS = {"email": 60.0, "light": 60.0, "heavy": 1800.0}
#: longest retry delay (the backoff cap) and longest time limit decide the visibility
LONGEST_RETRY_DELAY = 600.0
VISIBILITY_TIMEOUT = int(
    _env.get("CONVENTIONS_VISIBILITY_TIMEOUT")
    or int(max(WORKLOAD_TIME_LIMITS.values()) + LONGEST_RETRY_DELAY) * 2
)

# -- broker and results --------------------------------------------------------------------
broker_url = _env.get("CELERY_BROKER_URL") or REDIS_URL
broker_connection_retry_on_startup = True
broker_transport_options: dict[str, Any] = {
    "visibility_timeout": VISIBILITY_TIMEOUT,
    # one list per queue: a worker reading one queue blocks on it (conventions.transport.redis)
    "priority_steps": [0],
    # a killed worker's in-flight fetch goes back to its queue after this many seconds
    "inbox_timeout": min(60, VISIBILITY_TIMEOUT),
}
if broker_url.startswith(("redis://", "rediss://")):
    # a fetch that cannot lose a message: see conventions/transport/redis.py
    broker_transport = "conventions.transport.redis:Transport"
if EMBEDDED:
    _queue_dir = DATA_DIR / "broker"
    for _sub in ("out", "processed"):
        (_queue_dir / _sub).mkdir(parents=True, exist_ok=True)
    broker_transport_options = {
        "data_folder_in": str(_queue_dir / "out"),
        "data_folder_out": str(_queue_dir / "out"),
        "processed_folder": str(_queue_dir / "processed"),
        "store_processed": False,
    }
    (DATA_DIR / "results").mkdir(parents=True, exist_ok=True)
if not EMBEDDED and _env.get("CONVENTIONS_UNACKED_RESTORE_INTERVAL"):
    broker_transport_options["unacked_restore_interval"] = int(
        _env["CONVENTIONS_UNACKED_RESTORE_INTERVAL"]
    )
    broker_transport_options["unacked_restore_throttle"] = 1  # every interval, not every 10th
if not EMBEDDED and _env.get("CONVENTIONS_UNACKED_MUTEX_EXPIRE"):
    broker_transport_options["unacked_mutex_expire"] = int(_env["CONVENTIONS_UNACKED_MUTEX_EXPIRE"])

result_backend = _env.get("CELERY_RESULT_BACKEND") or (
    f"file://{DATA_DIR / 'results'}" if EMBEDDED else REDIS_URL
)
if result_backend.startswith(("redis://", "rediss://")):
    # Celery's Redis backend whose STARTED and SUCCESS writes carry the ledger's claim and
    # completion when the store shares the server: see conventions/transport/results.py
    result_backend = f"conventions.transport.results:RedisBackend+{result_backend}"
result_expires = 86400
# A result write that fails on a lost connection (STARTED, or the final state) waits for
# the backend to come back instead of failing the job outside its body, which acks it.
result_backend_always_retry = True
result_extended = True

# -- the reliable profile ------------------------------------------------------------------
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
# Keep running late-ack jobs when the broker connection drops: Celery would cancel them
# and then ack their messages, losing them; the ledger makes a second delivery harmless.
worker_cancel_long_running_tasks_on_connection_loss = False
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]
task_send_sent_event = True
worker_send_task_events = True
task_track_started = True
worker_soft_shutdown_timeout = 10.0
worker_enable_soft_shutdown_on_idle = True
task_time_limit = 300
task_soft_time_limit = 270
enable_utc = True
timezone = "UTC"

# -- routing -------------------------------------------------------------------------------
task_create_missing_queues = False
task_default_queue = "email"
task_queues = routing.queues_for(WORKLOADS)
task_routes = (routing.WorkloadRouter(WORKLOADS),)

# -- the layer -----------------------------------------------------------------------------
# a message the worker cannot run is dead-lettered (raw body kept), never just logged
worker_consumer = "conventions.worker.consumer:Consumer"
conventions_workloads = WORKLOADS
conventions_workload_time_limits = WORKLOAD_TIME_LIMITS
conventions_store_url = _env.get("CONVENTIONS_STORE_URL") or (
    f"sqlite:///{DATA_DIR / 'store.sqlite3'}" if EMBEDDED else REDIS_URL
)
conventions_lease_seconds = float(_env.get("CONVENTIONS_LEASE_SECONDS", "30"))
conventions_log_format = _env.get("CONVENTIONS_LOG_FORMAT", "text")
#: how long a job may wait in each queue before QueueOldestJobOverSLO fires (seconds)
conventions_queue_slo_seconds = {"email": 120.0, "heavy": 1800.0}
conventions_shutdown_grace_seconds = float(_env.get("CONVENTIONS_SHUTDOWN_GRACE", "60"))
#: where ``conventions metrics serve`` listens without ``--addr``: this machine only, since
#: ``/metrics`` has no auth (docker/compose.yaml passes ``--addr 0.0.0.0`` in its network)
conventions_metrics_addr = _env.get("CONVENTIONS_METRICS_ADDR") or "127.0.0.1"
conventions_doctor_levels = dict(
    item.split("=", 1) for item in _env.get("CONVENTIONS_DOCTOR_LEVELS", "").split(",") if item
)

# -- schedules (docs/howto/schedules.md) ----------------------------------------------------
#: the reference app's entries: one place, read by beat and by the watchdog
SCHEDULE = [
    schedules.Entry(
        "daily-sales",
        "reports.daily_sales.v1",
        schedules.daily(at="03:00", tz="Asia/Bangkok"),
        payload=schedules.business_date(days=-1),  # the Bangkok day that just ended
        overlap="allow",
        catch_up=6 * 3600,
        expect=schedules.succeeds_by("04:00"),
    ),
    watchdog.entry(),
]
beat_scheduler = "conventions.schedules.beat:Scheduler"
conventions_schedule = _env.get("CONVENTIONS_SCHEDULE") or SCHEDULE
conventions_clock_offset_seconds = float(_env.get("CONVENTIONS_CLOCK_OFFSET_SECONDS") or 0)

# -- the reference app ---------------------------------------------------------------------
shop_database_url = _env.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'shop.sqlite3'}"
shop_smtp_url = _env.get("SMTP_URL")
reports_chunk_rows = int(_env.get("REPORTS_CHUNK_ROWS", "1000"))
reports_chunk_pause_seconds = float(_env.get("REPORTS_CHUNK_PAUSE", "0"))
#: the web app's database: ``outbox.add`` writes there, ``conventions outbox relay`` reads
conventions_outbox_url = _env.get("CONVENTIONS_OUTBOX_URL") or shop_database_url
sentry_dsn = _env.get("SENTRY_DSN")
