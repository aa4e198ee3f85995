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
counters are zeroed before it and dumped after it (``callgrind_control``, as
:mod:`bench.cluster_instructions` does), for all jobs, so the figures are per step and
per job. The broker's fetch, ack and Celery's events are
not here (``bench.scale`` counts the whole path); nor is a real worker: what is counted
is the store's scripts alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis

from bench import results, tables_scale
from bench.cluster_instructions import dump, valgrind, zero
from bench.idle import own_redis
from conventions.observability import audit
from conventions.store import RedisStore
from conventions.store.records import AuditEvent
from conventions.store.redis_results import ResultWrite
from conventions.tracing import headers as hdr

TASK = "billing.charge.v2"
MESSAGE = json.dumps({"body": "x" * 1400, "headers": {"id": "0" * 36}})
STEPS = ("publish", "claim", "complete")
#: jobs a worker runs at once (its claims, then their completions)
WAVE = 4
#: jobs run before the count
WARM_UP = 150


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

    def _event(self, name: str, **more: Any) -> AuditEvent | None:
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


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def run(jobs: int, config: str = "full") -> dict[str, Any]:
    """Instructions and commands per job, per step, of one of :data:`CONFIGS`."""
    audited, runs_on = CONFIGS[config]
    folder = Path(tempfile.mkdtemp(prefix="cc-store-instr-"))
    try:
        with own_redis(valgrind(folder), ["--hz", "1", "--dir", str(folder)], timeout=120,
                       decode_responses=True, socket_timeout=120) as client:  # fmt: skip
            return _count(client, folder, jobs, audited, runs_on)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _count(
    client: redis.Redis, folder: Path, jobs: int, audited: bool, runs_on: bool
) -> dict[str, Any]:
    port = int(client.connection_pool.connection_kwargs["port"])
    pid = int(client.info("server")["process_id"])
    store = RedisStore(client, prefix="cc:", runs_enabled=runs_on)
    # warm-up: every script loaded, and the fleet-wide indexes past Redis's small
    # encoding (128 members), as any store in use has them
    for job in [Job(store, audited) for _ in range(WARM_UP)]:
        job.publish()
        job.claim()
        job.complete()
    batch = [Job(store, audited) for _ in range(jobs)]
    # the publishes first (a backlog), then claims and completions in waves of WAVE jobs,
    # as a worker's slots run them: the running index stays as small as a worker keeps it
    # (a sorted set's cost grows with its size)
    waves = [("publish", batch)] + [
        (step, batch[i : i + WAVE]) for i in range(0, jobs, WAVE) for step in STEPS[1:]
    ]

    def window(step: str, wave: list[Job]) -> int:
        """The instructions Redis ran between a zero and a dump around ``wave``."""
        zero(pid)
        for job in wave:
            getattr(job, step)()
        return dump(folder, port, pid)

    # what a window costs with no job in it (the server's cron while valgrind runs the
    # control calls): taken out of each window
    empty = sorted(window("publish", []) for _ in range(5))[2]
    instructions: collections.Counter[str] = collections.Counter()
    calls: dict[str, collections.Counter[str]] = {step: collections.Counter() for step in STEPS}
    for step, wave in waves:
        before = _calls(client)
        instructions[step] += window(step, wave) - empty
        after = _calls(client)
        calls[step].update(
            {name: after[name] - before.get(name, 0) for name in after if name != "info"}
        )
    return {
        step: {
            "instructions": instructions[step] / jobs,
            "commands": sum(n for name, n in calls[step].items() if name not in ("evalsha", "eval"))
            / jobs,
            "by_command": {name: n / jobs for name, n in sorted(calls[step].items()) if n},
        }
        for step in STEPS
    }


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
    args = parser.parse_args(argv)
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
