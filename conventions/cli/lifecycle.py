"""The ``conventions doctor`` and ``conventions status`` commands.

    conventions doctor [--json] [--static] [--timeout S]
    conventions status TASK_ID [--json]

``doctor`` exits 1 when it finds an error (warnings alone exit 0); ``status`` exits 1
when nothing is known about the job. Both exit 3 when the broker, the store or the result
backend does not answer within the group's ``--timeout``.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from conventions.cli import backends
from conventions.cli.base import REFUSED, command, json_option, options_of, print_json
from conventions.cli.format import shown
from conventions.observability import progress
from conventions.ops import doctor, doctor_formats, doctor_live


@command("doctor")
@json_option
@click.option("--static", is_flag=True, help="configuration only: ask no worker, no queue")
@click.option(
    "--timeout",
    "reply_timeout",
    type=float,
    default=doctor_live.DEFAULT_TIMEOUT,
    metavar="SECONDS",
    help=f"how long to wait for the workers' replies (default {doctor_live.DEFAULT_TIMEOUT})",
)
def run_doctor(app: Any, as_json: bool, static: bool, reply_timeout: float) -> int:
    """Check the configuration, the workers and the queues for danger."""
    findings = static_checks(app, options_of(click.get_current_context()).timeout)
    live = None
    if not static:
        live = doctor_live.observe(app, timeout=reply_timeout)
        findings += doctor_live.live_checks(app, live)
    failed = bool(doctor.errors(findings))
    if as_json:
        report: dict[str, Any] = {"ok": not failed, "findings": [f.to_dict() for f in findings]}
        if live is not None:
            report["workers"] = live.consumers
            report["backlog"] = live.backlog
        print_json(report)
    else:
        if live is not None:
            for node, queues in sorted(live.consumers.items()):
                consumes = shown(", ".join(queues) or "(nothing)")
                print(f"worker {shown(node)}: consumes {consumes}")
        print(doctor.format_text(findings))
    return REFUSED if failed else 0


def static_checks(app: Any, timeout: float) -> list[doctor.Finding]:
    """The doctor's static checks, asking each Redis server for its settings with the
    command's timeout (the doctor's own client waits 5 s per call, twice, on a server that
    accepts and never answers). The checks read the app's own settings, not the bounded
    ones this command runs with (``result_backend_always_retry`` is off for the command,
    never for the app's workers)."""
    own = backends.own_settings(app)
    findings = doctor.static_checks(app, server=False, conf=own)
    for url in doctor.redis_servers(own):
        bounded = url if ";" in url else backends.with_timeouts(url, timeout)
        server = doctor._redis_server_checks(bounded, own)
        findings += doctor.apply_levels(server, own)
    stamps = doctor_formats.format_findings(app, write=False, timeout=timeout)
    return findings + doctor.apply_levels(stamps, own)


def job_status(app: Any, task_id: str) -> dict[str, Any]:
    """What the result backend and the store know about job ``task_id``."""
    result = app.AsyncResult(task_id)
    state = str(result.state)
    info = result.info if state == progress.PROGRESS_STATE else None
    latest = progress.read_progress(app.store, task_id)
    if latest is None and isinstance(info, dict):
        latest = info
    return {"task_id": task_id, "state": state, "progress": latest}


@command("status")
@click.argument("task_id", metavar="TASK_ID")
@json_option
def run_status(app: Any, task_id: str, as_json: bool) -> int:
    """A job's state and progress."""
    status = job_status(app, task_id)
    known = status["state"] != "PENDING" or status["progress"] is not None
    if as_json:
        print_json(status)
    elif not known:
        print(f"conventions: nothing known about job {task_id}", file=sys.stderr)
    else:
        print(f"{shown(task_id)}: {shown(status['state'])}")
        latest = status["progress"]
        if latest:
            total = latest.get("total")
            done = f"{latest.get('done')} of {total}" if total else f"{latest.get('done')}"
            percent = f" ({latest['percent']}%)" if latest.get("percent") is not None else ""
            note = shown(latest.get("note") or "")
            print(f"progress: {shown(done)}{percent} {note}".rstrip())
            print(f"updated: {shown(latest.get('updated_at'))}")
    return 0 if known else REFUSED


#: the commands this module adds to ``conventions``
COMMANDS = (run_doctor, run_status)
