"""One chaos run: workers, a publisher, a plan of blows, and the count at the end.

A :class:`Crew` keeps two prefork workers alive on the chaos Redis: a worker killed or
stopped is replaced at once by a new one (the restart a supervisor would do). The run
ends when every job has taken effect and the broker holds nothing (no queued message,
no unacknowledged one), or when nothing has moved for ``STALL`` seconds (raw Celery's
lost jobs never come back).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis
from sqlalchemy import Engine

from conventions.store import open_store
from conventions.transport import layout
from conventions.transport.redis import in_inboxes
from tests.acceptance.support_chaos import (
    APPLIED,
    Outcome,
    RedisServer,
    Worker,
    measure,
    publish,
    scalar,
    worker_env,
)

#: how long nothing may move before a run is declared over: longer than raw Celery's
#: 10 s visibility timeout + a 5 s restore mutex left by a worker killed mid-sweep + the
#: 2 s sweep interval (ours: the 6 s recovery bound + a 2 s sweep + a 2 s mutex), so that
#: a stranded message always comes back
STALL = 20.0
#: lines of each worker's log printed when a run lost or duplicated a job
LOG_TAIL = 40
#: the longest a run may take, blows and drain included
DEADLINE = 150.0
#: the queue and the app of each profile
QUEUES = {"ours": "email", "default": "celery", "acks_late": "celery"}
APPS = {"ours": "tasks", "default": "tests.acceptance.support_raw", "acks_late": ""}
APPS["acks_late"] = APPS["default"]


class Crew:
    """Two live workers of one profile; every blow is followed by a replacement."""

    def __init__(self, profile: str, env: dict[str, str], folder: Path) -> None:
        self.profile, self.env, self.folder = profile, env, folder
        self.queue = QUEUES[profile]
        self.live: list[Worker] = []
        self.all: list[Worker] = []
        self.lock = threading.Lock()
        self.starting: list[threading.Thread] = []
        #: pool processes already killed: a killed child stays listed until it is reaped,
        #: and a second SIGKILL to it would count a blow that never landed
        self.killed: set[int] = set()

    def start(self, count: int = 2) -> None:
        for _ in range(count):
            self._start_one()

    def _start_one(self) -> None:
        with self.lock:
            name = f"{self.profile}-{len(self.all) + 1}"
            worker = Worker(APPS[self.profile], name, self.queue, self.env, self.folder)
            self.all.append(worker)
        worker.wait_ready()
        with self.lock:
            self.live.append(worker)

    def replace_later(self) -> None:
        thread = threading.Thread(target=self._start_one, daemon=True)
        thread.start()
        self.starting.append(thread)

    def pick(self, rng: random.Random, timeout: float = 90) -> Worker | None:
        """A random live worker; waits for a replacement when every worker is down."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.live:
                    return rng.choice(self.live)
            time.sleep(0.1)
        return None

    def kill_nine(
        self, rng: random.Random, whole: bool, before: Callable[[Worker], object] | None = None
    ) -> str:
        """``kill -9`` a whole worker (main process and pool), or one pool process;
        ``before`` is called with the victim just before a whole worker's kill."""
        victim = self.pick(rng)
        if victim is None:
            return "none live"
        if whole:
            with self.lock:
                self.live.remove(victim)
            if before is not None:
                before(victim)
            victim.kill_all()
            self.replace_later()
            return f"kill -9 {victim.name} (main and pool)"
        children = self.fresh_children(victim)
        if not children:
            return f"{victim.name} had no live pool process"
        pid = rng.choice(children)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return f"{victim.name}'s pool process {pid} was gone"
        self.killed.add(pid)
        return f"kill -9 {victim.name} pool process {pid}"

    def fresh_children(self, victim: Worker, timeout: float = 10) -> list[int]:
        """The worker's pool processes not killed yet; waits for the pool to replace a
        killed one when there is none."""
        deadline = time.monotonic() + timeout
        while True:
            children = [pid for pid in victim.children() if pid not in self.killed]
            if children or time.monotonic() > deadline:
                return children
            time.sleep(0.1)

    def sigterm(self, rng: random.Random) -> str:
        victim = self.pick(rng)
        if victim is None:
            return "none live"
        with self.lock:
            self.live.remove(victim)
        self.replace_later()  # the new worker starts while the old one drains
        victim.terminate()
        return f"SIGTERM {victim.name} (warm shutdown)"

    def stop(self) -> None:
        for thread in self.starting:
            thread.join(90)
        for worker in self.all:
            worker.terminate(timeout=30)


def settle(  # noqa: PLR0917
    engine: Engine, broker: redis.Redis, queue: str, jobs: int, deadline: float, patient: bool
) -> None:
    """Wait until every job took effect and the broker holds nothing, or nothing moved for
    ``STALL`` seconds (``patient``: and no message is unacknowledged either, since it
    comes back), or the deadline passed."""
    last: tuple[int, ...] = ()
    moved = time.monotonic()
    while time.monotonic() < deadline:
        try:
            held = broker.hlen("unacked") + in_inboxes(broker)
            state = (scalar(engine, APPLIED), broker.llen(queue), held)
        except redis.ConnectionError:  # the Redis of the run is restarting
            time.sleep(0.5)
            continue
        if state[0] == jobs and state[1] == 0 and state[2] == 0:
            return
        if state != last:
            last, moved = state, time.monotonic()
        elif time.monotonic() - moved > STALL and not (patient and state[2]):
            return
        time.sleep(0.5)


def wait_applied(engine: Engine, at_least: int, timeout: float = 60) -> None:
    """Wait until ``at_least`` events took effect: the blows land under load."""
    deadline = time.monotonic() + timeout
    while scalar(engine, APPLIED) < at_least and time.monotonic() < deadline:
        time.sleep(0.1)


def _published(publisher: subprocess.Popen[bytes]) -> None:
    """Wait for the publisher (once) and check that it published everything."""
    if publisher.returncode is not None:
        return
    out, _ = publisher.communicate(timeout=120)
    assert publisher.returncode == 0, out.decode(errors="replace")


Blow = Callable[[Crew, random.Random], str]


def diagnosis(server: RedisServer, crew: Crew, queue: str) -> str:
    """What the broker holds and each worker's last log lines: printed when a run lost
    or duplicated a job, so that a failure in CI says why."""
    lines = [f"\n--- diagnosis: the broker ({server.url(0)}) ---"]
    try:
        with redis.Redis.from_url(server.url(0), socket_timeout=5) as broker:
            lines.append(
                f"{queue}: {broker.llen(queue)} waiting, {broker.hlen('unacked')} unacked, "
                f"{in_inboxes(broker)} in inboxes, {layout.delayed(broker, queue)}; consumers "
                f"alive {layout.consumers_alive(broker)}; restore mutex "
                f"{broker.get('unacked_mutex')!r} (ttl {broker.ttl('unacked_mutex')})"
            )
    except redis.RedisError as exc:
        lines.append(f"the broker did not answer: {exc!r}")
    for worker in crew.all:
        state = "alive" if worker.alive() else f"exited {worker.proc.returncode}"
        tail = worker.output().splitlines()[-LOG_TAIL:]
        lines += [f"--- {worker.name} ({state}), last {len(tail)} lines ---", *tail]
    return "\n".join(lines)


def run(  # noqa: PLR0917
    scenario: str,
    profile: str,
    server: RedisServer,
    engine: Engine,
    folder: Path,
    jobs: int,
    blows: list[Blow],
    seed: int,
    publish_first: bool = False,
    env_extra: dict[str, str] | None = None,
) -> Outcome:
    """Publish ``jobs`` payment jobs to two workers of ``profile``, deal ``blows`` at
    random moments once work is under way (and, with ``publish_first``, once every job
    is published), wait for the end, and count (``env_extra``: more of the workers'
    environment)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    env = worker_env(server, engine, RAW_PROFILE=profile, **(env_extra or {}))
    broker = redis.Redis.from_url(server.url(0))
    crew = Crew(profile, env, folder)
    done: list[str] = []
    started = time.monotonic()
    try:
        crew.start(2)
        publisher = publish("ours" if profile == "ours" else "raw", jobs, env)
        if publish_first:
            _published(publisher)
        wait_applied(engine, jobs // 20)
        for blow in blows:
            done.append(blow(crew, rng))
            time.sleep(rng.uniform(0.3, 2.0))
        _published(publisher)
        for thread in crew.starting:
            thread.join(90)
        settle(engine, broker, QUEUES[profile], jobs, started + DEADLINE, profile != "default")
    finally:
        crew.stop()
        broker.close()
    counts = measure(engine, receipts=profile == "ours")
    if profile == "ours" and (counts["lost"] or counts["duplicated"]):
        print(diagnosis(server, crew, QUEUES[profile]))
    dead_letters = None
    if profile == "ours":
        store = open_store(server.url(1))
        dead_letters = store.count_dead_letters()
        store.close()
    return Outcome(
        scenario=scenario,
        profile=profile,
        jobs=jobs,
        seconds=round(time.monotonic() - started, 1),
        chaos="; ".join(done),
        dead_letters=dead_letters,
        **counts,
    )
