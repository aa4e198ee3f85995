"""``python -m bench.store_instructions [--jobs N] [--out FILE]``: what the Redis store's
scripts cost Redis per job, counted in **instructions** (valgrind's callgrind) and in
commands (``INFO commandstats``): numbers no load on the machine changes, to compare two
commits of the scripts, and what the audit trail and run history each cost (#32: conv's
Redis CPU per job against raw Celery's).

Three configurations, in one run: the reliable profile as it is (``full``: each step
records its audit event and moves the job's run record), run history off
(``conventions_runs_enabled = False``: the audit events only), and neither (no audit
event, no run: the ledger, the dedup, the push and Celery's result writes alone).

A ``redis-server`` of its own runs under ``valgrind --tool=callgrind`` (no persistence).
One job's store steps, as the reliable profile sends them, ``N`` times (after a warm-up
of 150, so every script is loaded and the fleet-wide indexes are past Redis's
small encoding): the publish (``reserve_and_push``: the reservation,
its audit event and run change, kombu's ``LPUSH`` of a 1.5 KB message and the queue's
bell), the claim (with its audit event, run change and Celery's STARTED write) and the
completion (the same, with the SUCCESS write and the delivery counter). Each step's
counters are zeroed before it and dumped after it (``callgrind_control``), for all jobs,
so the figures are per step and per job. The broker's fetch, ack and Celery's events are
not here (``bench.scale`` counts the whole path); nor is a real worker: what is counted
is the store's scripts alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench import results, tables_scale
from bench.cluster_instructions import summary
from conventions.observability import audit
from conventions.store import RedisStore
from conventions.store.redis_results import ResultWrite
from conventions.tracing import headers as hdr

TASK = "billing.charge.v2"
MESSAGE = json.dumps({"body": "x" * 1400, "headers": {"id": "0" * 36}})
STEPS = ("publish", "claim", "complete")
#: jobs a worker runs at once (its claims, then their completions)
WAVE = 4
#: jobs run before the count
WARM_UP = 150


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _result(task_id: str, status: str) -> str:
    return json.dumps(
        {
            "status": status,
            "result": None,
            "traceback": None,
            "children": [],
            "date_done": None,
            "task_id": task_id,
        }
    )


#: the configurations: whether the steps record audit events, whether the store keeps runs
CONFIGS: dict[str, tuple[bool, bool]] = {
    "full": (True, True),
    "no_runs": (True, False),
    "neither": (False, False),
}


class Job:
    """One job's store steps (publish, claim, complete), as a worker of the reliable
    profile sends them (``audited``: with their audit events)."""

    def __init__(self, store: RedisStore, audited: bool = True) -> None:
        self.store = store
        self.audited = audited
        self.id = str(uuid.uuid4())
        self.key = f"charge:{uuid.uuid4().hex[:12]}"
        self.head: dict[str, Any] = {
            hdr.CORRELATION: str(uuid.uuid4()),
            hdr.IDEMPOTENCY_KEY: self.key,
            hdr.CAUSATION: f"request:{uuid.uuid4().hex[:8]}",
        }
        self.owner = uuid.uuid4().hex

    def _event(self, name: str, **more: Any) -> audit.AuditEvent | None:
        return audit.event(name, TASK, self.id, self.head, **more) if self.audited else None

    def publish(self) -> None:
        event = self._event("published")
        self.store.reserve_and_push(
            self.store.client,
            "email",
            MESSAGE,
            self.key,
            self.id,
            3600,
            event,
            fingerprint="v1:0123456789abcdef",
            bell=("_cc.bell.email", 1, 60),
        )

    def claim(self) -> None:
        event = self._event("started", attempt=1)
        started = ResultWrite(
            f"celery-task-meta-{self.id}", _result(self.id, "STARTED"), 86400, self.store.database
        )
        self.store.claim(self.key, self.owner, 30, self.id, audit=event, result=started)

    def complete(self) -> None:
        event = self._event("succeeded", attempt=1, detail={"run_s": 0.004})
        success = ResultWrite(
            f"celery-task-meta-{self.id}", _result(self.id, "SUCCESS"), 86400, self.store.database
        )
        self.store.complete(
            self.key,
            self.owner,
            "succeeded",
            7 * 86400,
            self.id,
            audit=event,
            result=success,
            fingerprint="v1:0123456789abcdef",
            delivery_id=self.id,
        )


def _control(pid: int, *args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=120
    )


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def run(jobs: int, config: str = "full", keep: Path | None = None) -> dict[str, Any]:
    """Instructions and commands per job, per step, of one of :data:`CONFIGS` (``keep``:
    each step's callgrind file copied there, for ``callgrind_annotate``)."""
    audited, runs_on = CONFIGS[config]
    folder = Path(tempfile.mkdtemp(prefix="cc-store-instr-"))
    port = _port()
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--dump-line=no",
            "--compress-strings=no",
            f"--callgrind-out-file={folder}/callgrind.out",
            "redis-server",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--hz",
            "1",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, decode_responses=True, socket_timeout=120)
    try:
        for _ in range(600):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        store = RedisStore(client, prefix="cc:", runs_enabled=runs_on)
        # warm-up: every script loaded, and the fleet-wide indexes past Redis's small
        # encoding (128 members), as any store in use has them
        for job in [Job(store, audited) for _ in range(WARM_UP)]:
            job.publish(), job.claim(), job.complete()
        batch = [Job(store, audited) for _ in range(jobs)]
        totals = {step: {"instructions": 0, "calls": collections.Counter()} for step in STEPS}
        # the publishes first (a backlog), then claims and completions in waves of
        # WAVE jobs, as a worker's slots run them: the running index stays as small as
        # a worker keeps it (a sorted set's cost grows with its size)
        waves = [("publish", batch)] + [
            (step, batch[i : i + WAVE]) for i in range(0, jobs, WAVE) for step in STEPS[1:]
        ]

        def window(step: str, wave: list[Job]) -> int:
            """The instructions Redis ran between a zero and a dump around ``wave``."""
            _control(server.pid, "--zero")
            for job in wave:
                getattr(job, step)()
            for dump in folder.glob("callgrind.out*"):
                dump.unlink()
            _control(server.pid, "--dump")
            text = "".join(p.read_text() for p in folder.glob("callgrind.out*"))
            if keep is not None and wave:
                keep.mkdir(parents=True, exist_ok=True)
                with (keep / f"{step}.callgrind").open("a") as out:
                    out.write(text)
            return summary(text)

        # what a window costs with no job in it (the server's cron while valgrind runs
        # the control calls): taken out of each window
        empty = sorted(window("publish", []) for _ in range(5))[2]
        for step, wave in waves:
            before = _calls(client)
            totals[step]["instructions"] += window(step, wave) - empty
            after = _calls(client)
            totals[step]["calls"].update(
                {name: after[name] - before.get(name, 0) for name in after if name != "info"}
            )
        rows: dict[str, Any] = {}
        for step, total in totals.items():
            calls = total["calls"]
            rows[step] = {
                "instructions": total["instructions"] / jobs,
                "commands": sum(n for name, n in calls.items() if name not in ("evalsha", "eval"))
                / jobs,
                "by_command": {name: n / jobs for name, n in sorted(calls.items()) if n},
            }
        return rows
    finally:
        server.terminate()
        server.wait(60)
        client.close()
        shutil.rmtree(folder, ignore_errors=True)


def measure(jobs: int, command: str) -> dict[str, Any]:
    """Every configuration, one after the other, as a result file holds them."""
    at_start = results.load()
    configs = {name: run(jobs, name) for name in CONFIGS}
    return {**results.meta(command, at_start), "jobs": jobs, "configs": configs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.store_instructions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--out", type=Path, help="also write the result file here")
    parser.add_argument(
        "--keep", type=Path, help="one run of the full configuration, its callgrind files kept here"
    )
    args = parser.parse_args(argv)
    if args.keep is not None:
        run(args.jobs, "full", args.keep)
        return 0
    command = f"python -m bench.store_instructions --jobs {args.jobs}"
    if args.out:
        command += f" --out {args.out}"
    data = measure(args.jobs, command)
    print("\n".join(tables_scale.store_instructions(data)))
    if args.out:
        results.write(args.out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
