"""The ``conventions doctor`` and ``conventions status`` commands.

    conventions doctor [--json] [--static] [--timeout S]
    conventions status TASK_ID [--json]

``doctor`` exits 1 when it finds an error (warnings alone exit 0); ``status`` exits 1
when nothing is known about the job.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from conventions.observability import progress
from conventions.ops import doctor, doctor_live


def add_parsers(commands: Any) -> None:
    """Add ``doctor`` and ``status`` to the ``conventions`` sub-commands."""
    check = commands.add_parser(
        "doctor", help="check the configuration, the workers and the queues for danger"
    )
    check.add_argument("--json", action="store_true", help="print JSON")
    check.add_argument(
        "--static", action="store_true", help="configuration only: ask no worker, no queue"
    )
    check.add_argument(
        "--timeout",
        type=float,
        default=doctor_live.DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long to wait for the workers' replies (default {doctor_live.DEFAULT_TIMEOUT})",
    )
    status = commands.add_parser("status", help="a job's state and progress")
    status.add_argument("task_id", metavar="TASK_ID")
    status.add_argument("--json", action="store_true", help="print JSON")


def run_doctor(app: Any, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    findings = doctor.static_checks(app)
    live = None
    if not args.static:
        live = doctor_live.observe(app, timeout=args.timeout)
        findings += doctor_live.live_checks(app, live)
    failed = bool(doctor.errors(findings))
    if args.json:
        report: dict[str, Any] = {
            "ok": not failed,
            "findings": [f.to_dict() for f in findings],
        }
        if live is not None:
            report["workers"] = live.consumers
            report["backlog"] = live.backlog
        print(json.dumps(report, indent=2), file=out)
    else:
        if live is not None:
            for node, queues in sorted(live.consumers.items()):
                print(f"worker {node}: consumes {', '.join(queues) or '(nothing)'}", file=out)
        print(doctor.format_text(findings), file=out)
    return 1 if failed else 0


def job_status(app: Any, task_id: str) -> dict[str, Any]:
    """What the result backend and the store know about job ``task_id``."""
    result = app.AsyncResult(task_id)
    state = str(result.state)
    info = result.info if state == progress.PROGRESS_STATE else None
    latest = progress.read_progress(app.store, task_id)
    if latest is None and isinstance(info, dict):
        latest = info
    return {"task_id": task_id, "state": state, "progress": latest}


def run_status(app: Any, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    status = job_status(app, args.task_id)
    known = status["state"] != "PENDING" or status["progress"] is not None
    if args.json:
        print(json.dumps(status, indent=2, default=str), file=out)
    elif not known:
        print(f"conventions: nothing known about job {args.task_id}", file=err)
    else:
        print(f"{args.task_id}: {status['state']}", file=out)
        latest = status["progress"]
        if latest:
            total = latest.get("total")
            shown = f"{latest.get('done')} of {total}" if total else f"{latest.get('done')}"
            percent = f" ({latest['percent']}%)" if latest.get("percent") is not None else ""
            print(f"progress: {shown}{percent} {latest.get('note') or ''}".rstrip(), file=out)
            print(f"updated: {latest.get('updated_at')}", file=out)
    return 0 if known else 1
