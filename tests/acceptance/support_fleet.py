"""The mixed fleet: workers and publishers of a release and of HEAD on one broker and store.

Every process runs the fleet project (``tests/acceptance/fleet_project``, its own
``tasks`` and ``celeryconfig``) from that folder, with one runtime's Python: the release's
venv (:mod:`tests.acceptance.support_release`) or this checkout's. Nothing of the
repository is on their path but the project (the environment is the packaging suite's
clean one), so each imports its own ``conventions``.

A :class:`FleetCrew` keeps a target number of live workers per runtime (``old``/``new``):
a worker killed is replaced by one of the runtime it lacks, and :meth:`FleetCrew.roll`
replaces the old ones one by one as a rolling deploy does (a new worker started and
ready, then the old one stopped with SIGTERM, a warm shutdown).
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from sqlalchemy import Engine

from conventions.store import open_store
from conventions.transport import layout
from conventions.transport.redis import in_inboxes
from tests.acceptance.chaos_runs import Blow, Crew, wait_applied
from tests.acceptance.support_chaos import APPLIED, CHAOS_RECOVERY, Worker, measure, scalar
from tests.acceptance.support_release import Runtime
from tests.packaging.conftest import clean_env

PROJECT = Path(__file__).resolve().parent / "fleet_project"
QUEUE = "fleet_payments"
KINDS = ("old", "new")


@dataclass
class Servers:
    """Where one fleet run's processes point."""

    broker_url: str
    store_url: str
    engine: Engine

    def env(self, kind: str, **extra: str) -> dict[str, str]:
        """The environment of a process of runtime ``kind`` (``old``/``new``)."""
        return clean_env({
            "FLEET_BROKER_URL": self.broker_url,
            "FLEET_STORE_URL": self.store_url,
            "FLEET_DATABASE_URL": self.engine.url.render_as_string(hide_password=False),
            "FLEET_RECOVERY_TIMEOUT": CHAOS_RECOVERY,
            "FLEET_RUNTIME": kind,
            **extra,
        })  # fmt: skip


class FleetCrew(Crew):
    """Live workers of two runtimes, ``target`` of each; a blow's replacement is of the
    runtime that lacks one, and a blow may aim at one runtime (:attr:`aim`)."""

    def __init__(
        self, runtimes: dict[str, Runtime], servers: Servers, folder: Path, target: dict[str, int]
    ) -> None:
        super().__init__("ours", {}, folder)
        self.queue = QUEUE
        self.runtimes, self.servers = runtimes, servers
        self.target = dict(target)
        self.kind: dict[str, str] = {}
        self.pending: list[Worker] = []
        #: the runtime the next blow picks its victim from (None: any)
        self.aim: str | None = None

    def start(self, count: int = 0) -> None:
        for _ in range(count or sum(self.target.values())):
            self._start_one()

    def _members(self, kind: str) -> int:
        return sum(self.kind[w.name] == kind for w in [*self.live, *self.pending])

    def _start_one(self) -> None:
        with self.lock:
            lacking = [k for k in KINDS if self._members(k) < self.target[k]]
            if not lacking:
                return
            kind = lacking[0]
            name = f"{kind}-{len(self.all) + 1}"
            worker = Worker(
                "tasks", name, self.queue, self.servers.env(kind), self.folder,
                launcher=self.runtimes[kind].celery, cwd=PROJECT,
            )  # fmt: skip
            self.kind[name] = kind
            self.all.append(worker)
            self.pending.append(worker)
        try:
            worker.wait_ready()
        finally:
            with self.lock:
                self.pending.remove(worker)
                if worker.alive():
                    self.live.append(worker)

    def pick(self, rng: random.Random, timeout: float = 90) -> Worker | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                fit = [w for w in self.live if self.aim in (None, self.kind[w.name])]
                if fit:
                    return rng.choice(fit)
            time.sleep(0.1)
        return None

    def roll(self, rng: random.Random) -> str:
        """Replace one old worker by a new one: the new one ready first, then the old one
        stopped with SIGTERM (running jobs finish, reserved ones go back)."""
        with self.lock:
            self.target["old"] -= 1
            self.target["new"] += 1
        self._start_one()
        self.aim = "old"
        victim = self.pick(rng)
        self.aim = None
        if victim is None:
            return "no old worker left"
        with self.lock:
            self.live.remove(victim)
        victim.terminate()
        return f"SIGTERM {victim.name} (rolled to new)"

    def live_kinds(self) -> dict[str, int]:
        with self.lock:
            return {k: sum(self.kind[w.name] == k for w in self.live) for k in KINDS}


def aimed(kind: str | None, whole: bool) -> Blow:
    """A kill -9 blow aimed at a worker of runtime ``kind``."""

    def blow(crew: Crew, rng: random.Random) -> str:
        assert isinstance(crew, FleetCrew)
        crew.aim = kind
        try:
            return crew.kill_nine(rng, whole=whole)
        finally:
            crew.aim = None

    return blow


def publish(
    runtime: Runtime, servers: Servers, kind: str, jobs: int, delayed_every: int
) -> subprocess.Popen[str]:
    """Start runtime ``kind``'s publisher of its half of the events."""
    parity = "odd" if kind == "old" else "even"
    return subprocess.Popen(
        [str(runtime.python), "-m", "tasks.publish", parity, str(jobs), str(delayed_every)],
        cwd=PROJECT, env=servers.env(kind), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def published(publisher: subprocess.Popen[str], timeout: float = 180) -> str:
    out, _ = publisher.communicate(timeout=timeout)
    assert publisher.returncode == 0, out
    return out.strip()


def who_ran(store_url: str) -> dict[str, dict[str, int]]:
    """``{runtime: {publisher: jobs}}`` from the project's counters (a run counts once
    per commit of its effect, so a killed run that never committed is not counted)."""
    with redis.Redis.from_url(store_url) as client:
        return {
            runner: {
                publisher: int(client.get(f"fleet:ran:{runner}:{publisher}") or 0)
                for publisher in KINDS
            }
            for runner in KINDS
        }


def stranded_on_redis(broker_url: str) -> dict[str, int]:
    """What the Redis broker still holds for the fleet's queue: waiting, delayed,
    unacknowledged, in inboxes."""
    with redis.Redis.from_url(broker_url) as client:
        return {
            "waiting": int(client.llen(QUEUE)),
            "delayed": layout.delayed(client, QUEUE).count,
            "unacked": int(client.hlen("unacked")),
            "inboxes": in_inboxes(client),
        }


def dead_letters(store_url: str) -> int:
    store = open_store(store_url)
    try:
        return store.count_dead_letters()
    finally:
        store.close()


@dataclass
class FleetOutcome:
    """One mixed-fleet run, as the report's table shows it."""

    broker: str
    seed: int
    jobs: int
    lost: int
    duplicated: int
    stranded: int
    dead_letters: int
    seconds: float
    blows: list[str] = field(default_factory=list)
    ran: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def kills(self) -> int:
        return sum(b.startswith("kill -9") for b in self.blows)

    @property
    def sigterms(self) -> int:
        return sum(b.startswith("SIGTERM") for b in self.blows)


def markdown(outcomes: list[FleetOutcome]) -> str:
    lines = [
        "| broker | jobs | kill -9 | rolled (SIGTERM) | lost | duplicated | stranded "
        "| dead letters | old ran old's/new's | new ran old's/new's | seconds | seed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        old, new = o.ran.get("old", {}), o.ran.get("new", {})
        lines.append(
            f"| {o.broker} | {o.jobs} | {o.kills} | {o.sigterms} | {o.lost} | {o.duplicated} "
            f"| {o.stranded} | {o.dead_letters} | {old.get('old', 0)}/{old.get('new', 0)} "
            f"| {new.get('old', 0)}/{new.get('new', 0)} | {o.seconds} | {o.seed} |"
        )
    lines.append("")
    lines.extend(f"- {o.broker}: {'; '.join(o.blows)}" for o in outcomes)
    return "\n".join(lines) + "\n"


#: nothing moved this long (seconds): the run is over (longer than the recovery bound,
#: a sweep and a restore mutex, so that a stranded message always comes back)
STALL = 30.0


def settle(engine: Engine, jobs: int, stranded: Callable[[], int | None], deadline: float) -> None:
    """Until every job took effect and the broker holds nothing of the fleet's (``stranded``
    says how much it holds, None while it does not answer), or nothing moved for
    :data:`STALL` seconds, or the deadline."""
    last: tuple[int, int | None] = (-1, None)
    moved = time.monotonic()
    while time.monotonic() < deadline:
        state = (scalar(engine, APPLIED), stranded())
        if state == (jobs, 0):
            return
        if state != last:
            last, moved = state, time.monotonic()
        elif time.monotonic() - moved > STALL:
            return
        time.sleep(0.5)


@dataclass
class Plan:
    """One fleet run: what the fleet is, what it is dealt."""

    broker: str
    jobs: int
    seed: int
    blows: list[Blow]
    #: every n-th job of each publisher waits in the delayed set (0: none)
    delayed_every: int = 10
    target: dict[str, int] = field(default_factory=lambda: {"old": 2, "new": 2})
    #: the longest the run may take, blows, rolling deploy and drain included (seconds)
    deadline: float = 200.0


def run(
    plan: Plan,
    runtimes: dict[str, Runtime],
    servers: Servers,
    folder: Path,
    stranded: Callable[[], int | None],
) -> tuple[FleetOutcome, FleetCrew]:
    """Start the fleet, publish from both runtimes, deal the blows once work is under way,
    roll every old worker to a new one, wait for the end, count."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(plan.seed)
    crew = FleetCrew(runtimes, servers, folder, plan.target)
    done: list[str] = []
    started = time.monotonic()
    try:
        crew.start()
        publishers = [
            publish(runtimes[kind], servers, kind, plan.jobs, plan.delayed_every) for kind in KINDS
        ]
        wait_applied(servers.engine, plan.jobs // 20)
        for blow in plan.blows:
            done.append(blow(crew, rng))
            time.sleep(rng.uniform(0.3, 2.0))
        for thread in crew.starting:
            thread.join(90)
        while crew.target["old"] > 0:  # the rolling deploy, under load
            done.append(crew.roll(rng))
        for publisher in publishers:
            done.append(published(publisher))
        settle(servers.engine, plan.jobs, stranded, started + plan.deadline)
    finally:
        crew.stop()
    counts = measure(servers.engine, receipts=False)
    left = stranded()
    outcome = FleetOutcome(
        broker=plan.broker, seed=plan.seed, jobs=plan.jobs, lost=counts["lost"],
        duplicated=counts["duplicated"], stranded=-1 if left is None else left,
        dead_letters=dead_letters(servers.store_url),
        seconds=round(time.monotonic() - started, 1), blows=done,
        ran=who_ran(servers.store_url),
    )  # fmt: skip
    return outcome, crew


def diagnosis(crew: FleetCrew, outcome: FleetOutcome, lines: int = 40) -> str:
    """Each worker's last lines and the first lost events, for a failed run."""
    text = [f"\n--- {outcome}"]
    for worker in crew.all:
        state = "alive" if worker.alive() else f"exited {worker.proc.returncode}"
        tail = worker.output().splitlines()[-lines:]
        text += [f"--- {worker.name} ({state}), last {len(tail)} lines ---", *tail]
    return "\n".join(text)
