"""The worker's start and stop: the doctor at start, a bounded grace at shutdown.

Start (``worker_init``, in the main process before the pool forks): the shared stop
flag is made, so that prefork children inherit it, and the doctor's static checks run:
an error refuses to start the worker (exit status 78, the message says the fix), a
warning is logged. Beat (``beat_init``) runs the doctor's clock check the same way: its
business dates come from its own clock (:mod:`conventions.transport.skew`). Both read
the stored formats' stamps once (:mod:`conventions.ops.doctor_formats`): data newer than
this release refuses the start.

Stop: on SIGTERM Celery begins a warm shutdown (no new jobs) and sends
``worker_shutting_down``; the stop flag is set, so running jobs see
``ctx.is_stopping()`` turn true, in every pool process. They get
``conventions_shutdown_grace_seconds`` to finish or to save a checkpoint and raise
``ResumeLater``. Whatever still runs after the grace is cancelled through Celery's own
cold shutdown (a SIGQUIT to the main process): after ``worker_soft_shutdown_timeout``
the running jobs' processes are terminated and, their messages never acked, the broker
hands them out again (Redis restores them when the worker's channel closes).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from conventions.ops import doctor
from conventions.worker import job_context as joblib

logger = logging.getLogger("conventions.worker.lifecycle")

#: the exit status of a worker the doctor refuses (sysexits' EX_CONFIG)
EX_CONFIG = 78
#: seconds running jobs get after SIGTERM when the app sets no grace
DEFAULT_GRACE = 60.0


def grace(conf: Any) -> float:
    """``conventions_shutdown_grace_seconds``; 0 or less: wait for the jobs, unbounded."""
    value = conf.get("conventions_shutdown_grace_seconds")
    return DEFAULT_GRACE if value is None else float(value)


def _app_of(sender: Any) -> Any:
    from celery import current_app

    return getattr(sender, "app", None) or current_app._get_current_object()


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """Main process, before the pool forks: share the stop flag; run the doctor."""
    joblib.share_stopping()
    app = _app_of(sender)
    if not hasattr(app, "conventions_settings"):
        return
    if app.conf.get("conventions_doctor_on_start") is False:
        return
    _refuse_on_errors(doctor.static_checks(app), "worker")


def on_beat_init(app: Any) -> None:
    """Beat, at start: its clock against the Redis servers' (the doctor's
    ``clock-skew`` check); an error refuses to start it, a warning is logged."""
    if app.conf.get("conventions_doctor_on_start") is False:
        return
    _refuse_on_errors(doctor.clock_checks(app), "beat")


def _refuse_on_errors(findings: list[Any], what: str) -> None:
    for finding in findings:
        if finding.level == doctor.WARNING:
            logger.warning("doctor: %s", finding.line())
    refused = doctor.errors(findings)
    if refused:
        lines = "\n".join(f"  {f.line()}" for f in refused)
        message = (
            f"conventions doctor refuses to start this {what}:\n{lines}\n"
            "(fix the configuration; conventions_doctor_levels can lower a check's level)"
        )
        logger.critical("%s", message)
        print(message, file=sys.stderr)
        raise SystemExit(EX_CONFIG)  # not an Exception: Celery's signal dispatch lets it out


def on_shutting_down(app: Any, how: Any = None) -> None:
    """Main process, on SIGTERM: flag the running jobs and bound their grace (``app``'s
    ``conventions_shutdown_grace_seconds``)."""
    joblib.mark_stopping()
    if str(how) != "Warm":
        return
    seconds = grace(app.conf)
    if seconds > 0:
        timer = threading.Timer(seconds, _grace_over, args=(seconds,))
        timer.name, timer.daemon = "conventions-shutdown-grace", True
        timer.start()


def _grace_over(seconds: float) -> None:
    from celery.worker import state

    running = len(state.active_requests)
    if not running:
        return
    logger.warning(
        "shutdown grace of %.0fs is over with %d job(s) running: cancelling them; their "
        "messages go back to the broker",
        seconds, running,
    )  # fmt: skip
    os.kill(os.getpid(), signal.SIGQUIT)  # Celery's cold shutdown: cancel, requeue, exit
