"""Celery settings: the only place that reads the environment.

It starts from the layer's reliable profile (``conventions.config.profile.reliable``:
every setting that differs from Celery's default is listed with its reason in
``docs/reference/settings.md``) and adds the reference app's own settings:

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
* ``CONVENTIONS_RECOVERY_TIMEOUT``: seconds after which a worker that died whole has its
  jobs given back (default 30, at most 36; a live worker renews them however long they run);
* ``CONVENTIONS_VISIBILITY_TIMEOUT``: test only: turns the renewal off and makes this the
  Redis visibility timeout again (seconds; tests shorten it to prove that a redelivered
  long job does not run twice).
* ``CONVENTIONS_SHUTDOWN_GRACE``: seconds running jobs get after SIGTERM (per worker lane);
* ``CONVENTIONS_METRICS_ADDR``: where the metrics exporter listens (default ``127.0.0.1``);
* ``CONVENTIONS_DOCTOR_LEVELS``: ``code=level,...`` lowers (or raises) a doctor check;
* ``REPORTS_CHUNK_ROWS``, ``REPORTS_CHUNK_PAUSE``: the daily report's chunk size and the
  pause between chunks (seconds) that keeps it gentle on the shop database.
* ``CONVENTIONS_SCHEDULE``: ``module:attribute`` of the schedule entries beat sends and the
  watchdog checks (default: ``SCHEDULE`` below);
* ``CONVENTIONS_CLOCK_OFFSET_SECONDS``: test only, shifts the schedules' clock and the clock
  the broker's delayed sets are moved by.
* ``CONVENTIONS_UNACKED_RESTORE_INTERVAL``, ``CONVENTIONS_UNACKED_MUTEX_EXPIRE``: how often
  (seconds) a worker without renewal sweeps a dead worker's unacked messages back, and how
  long a worker killed mid-sweep holds the sweep's mutex (the profile: a third of the
  recovery timeout each).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from conventions.config.profile import reliable
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
#: test only: more queues (comma-separated), one workload each, for a worker of many
#: queues (the idle-command count on five)
WORKLOADS.update({q: q for q in (_env.get("CONVENTIONS_TEST_QUEUES") or "").split(",") if q})
#: hard time limits per workload (seconds); soft limits sit 10% below
WORKLOAD_TIME_LIMITS = {"email": 60.0, "light": 60.0, "heavy": 1800.0}
#: a worker that died whole has its jobs running again this long after (seconds); the
#: heavy lane's 30-minute jobs are renewed by their live worker, never delivered twice
RECOVERY_TIMEOUT = float(_env.get("CONVENTIONS_RECOVERY_TIMEOUT") or 30)
#: test only: the visibility timeout as the recovery clock (no renewal), to force a
#: running job's redelivery
VISIBILITY_TIMEOUT = _env.get("CONVENTIONS_VISIBILITY_TIMEOUT")

# -- broker options beyond the profile's ---------------------------------------------------
_transport: dict[str, Any] = {}
if EMBEDDED:
    _queue_dir = DATA_DIR / "broker"
    for _sub in ("out", "processed"):
        (_queue_dir / _sub).mkdir(parents=True, exist_ok=True)
    _transport = {
        "data_folder_in": str(_queue_dir / "out"),
        "data_folder_out": str(_queue_dir / "out"),
        "processed_folder": str(_queue_dir / "processed"),
        "store_processed": False,
        # kombu's default is ./control, in whatever folder the process started
        "control_folder": str(_queue_dir / "control"),
    }
    (DATA_DIR / "results").mkdir(parents=True, exist_ok=True)
if not EMBEDDED and _env.get("CONVENTIONS_UNACKED_RESTORE_INTERVAL"):
    _transport["unacked_restore_interval"] = int(_env["CONVENTIONS_UNACKED_RESTORE_INTERVAL"])
    _transport["unacked_restore_throttle"] = 1  # every interval, not every 10th
if not EMBEDDED and _env.get("CONVENTIONS_UNACKED_MUTEX_EXPIRE"):
    _transport["unacked_mutex_expire"] = int(_env["CONVENTIONS_UNACKED_MUTEX_EXPIRE"])
if not EMBEDDED and VISIBILITY_TIMEOUT:
    _transport["renew_unacked"] = False
if not EMBEDDED and _env.get("CONVENTIONS_CLOCK_OFFSET_SECONDS"):
    _transport["clock_offset"] = float(_env["CONVENTIONS_CLOCK_OFFSET_SECONDS"])

# -- the reliable profile (conventions.config.profile; docs/reference/settings.md) ---------
# late acks, reject on worker lost, prefetch 1, JSON only, the layer's transport and result
# backend, retried result writes, events, soft shutdown, time limits, a bounded publish
broker_url = _env.get("CELERY_BROKER_URL") or REDIS_URL
globals().update(
    reliable(
        broker_url=broker_url,
        store_url=_env.get("CONVENTIONS_STORE_URL")
        or (f"sqlite:///{DATA_DIR / 'store.sqlite3'}" if EMBEDDED else REDIS_URL),
        result_backend=_env.get("CELERY_RESULT_BACKEND")
        or (f"file://{DATA_DIR / 'results'}" if EMBEDDED else REDIS_URL),
        recovery_timeout=RECOVERY_TIMEOUT,
        visibility_timeout=float(VISIBILITY_TIMEOUT) if VISIBILITY_TIMEOUT else None,
        # the tests shorten the visibility timeout below the time limits on purpose
        allow={"visibility_timeout"} if VISIBILITY_TIMEOUT else (),
        broker_transport_options=_transport,
    )
)

# -- routing (the profile refuses a route to an undeclared queue) ---------------------------
# task_queues is left to the App: one durable queue per workload queue (email, heavy; the
# default queue is email), quorum queues with a delivery limit on RabbitMQ
task_default_queue = "email"
task_routes = (routing.WorkloadRouter(WORKLOADS),)

# -- the layer -----------------------------------------------------------------------------
conventions_workloads = WORKLOADS
conventions_workload_time_limits = WORKLOAD_TIME_LIMITS
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
