"""The counters ``bench.scale`` reads around a phase, and its cost per job from them.

Each figure is a difference of the server's own counters (``INFO commandstats``,
``INFO cpu``, ``INFO memory``; ``/proc/<pid>/stat`` for RabbitMQ's ``beam.smp``) taken
around one phase; the round trips are the commands clients send, counted with
``MONITOR`` in a pass of their own (MONITOR's cost stays out of the CPU figures).
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import beam


class TripCounter:
    """What a ``MONITOR`` line is as a round trip: the key it counts under, or None.

    A script is one line (the commands it runs are marked ``lua``: none); a ``MULTI``
    ... ``EXEC`` pipeline is written at once, one trip counted as its ``exec``; a command
    after ``CLIENT REPLY SKIP`` gets no reply and rides the write of the command its
    client waits for (the fetch's sign of life, the held acks): none, or
    ``<name>:no-reply`` with ``detail``, which also names a ``PUBLISH``'s channel
    (``publish:<channel>``). Clients are told apart by ``client_address`` and
    ``client_port``."""

    def __init__(self, detail: bool = False) -> None:
        self.detail = detail
        self._in_transaction: set[tuple[str, str]] = set()
        self._skipping: set[tuple[str, str]] = set()

    def key(self, command: dict[str, Any]) -> str | None:
        line = str(command.get("command", ""))
        name = line.split(" ", 1)[0].lower()
        if command.get("client_type") == "lua" or name == "info":
            return None
        client = (str(command.get("client_address")), str(command.get("client_port")))
        if line.upper() == "CLIENT REPLY SKIP":
            self._skipping.add(client)
            return None
        if client in self._skipping:
            self._skipping.discard(client)
            return f"{name}:no-reply" if self.detail else None
        if name == "multi":
            self._in_transaction.add(client)
            return None
        if name in ("exec", "discard"):
            self._in_transaction.discard(client)
            return "exec"
        if client in self._in_transaction:
            return None
        if self.detail and name == "publish":
            return "publish:" + line.split(" ", 2)[1].strip('"').rsplit("/", 1)[-1]
        return name


@dataclass
class Phase:
    """One phase's cost per job, from the servers' counters."""

    phase: str
    broker: str
    variant: str
    jobs: int
    seconds: float
    #: Redis commands per job, those run inside scripts included
    redis_commands: float
    #: Redis round trips per job: commands sent by a client (a script is one, a MULTI/EXEC
    #: pipeline is one), counted by ``MONITOR`` in a second, smaller pass (MONITOR's own
    #: cost stays out of the CPU)
    redis_trips: float | None
    #: Redis CPU (user + system) per job, microseconds
    redis_cpu_us: float
    #: RabbitMQ CPU (user + system) per job, microseconds (None on Redis)
    rabbitmq_cpu_us: float | None
    #: Redis memory the phase left per job, bytes (audit, run history, ledger, results)
    redis_bytes: float
    #: the commands behind ``redis_commands``, per job, the busiest first
    commands: dict[str, float]
    #: the commands behind ``redis_trips``, per job, the busiest first
    trips: dict[str, float] = field(default_factory=dict)
    #: ``redis_cpu_us`` of each round (``redis_cpu_us`` is their median)
    cpu_rounds: list[float] = field(default_factory=list)


def _counters(client: Any) -> tuple[dict[str, int], float, int]:
    stats = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    cpu = client.info("cpu")
    used = int(client.info("memory")["used_memory"])
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), used


def beam_pid() -> int | None:
    """The RabbitMQ node's Erlang VM on this machine, or None."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "beam.smp":
                    return int(entry.name)
            except OSError:
                continue
    return None


def beam_cpu(pid: int | None) -> float | None:
    """Seconds of CPU (user + system) the process has used."""
    return beam.cpu(pid)


def beam_pids(amqp: str) -> list[int]:
    """The VMs of the nodes ``amqp`` names (each of a cluster's, found by their ports:
    :mod:`bench.beam`); else the first ``beam.smp`` of the machine."""
    found = beam.pids(amqp)
    if found:
        return found
    pid = beam_pid()
    return [pid] if pid is not None else []


class Meter:
    """The counters before a phase, and its cost per job after it."""

    def __init__(self, client: Any, broker: str, variant: str, pids: list[int]) -> None:
        self.client, self.broker, self.variant, self.pids = client, broker, variant, pids
        self.client.config_resetstat()
        self.start = _counters(client)
        self.beam = beam.cpu_of(pids)
        self.t0 = time.monotonic()

    def done(self, phase: str, jobs: int, trips: Trips | None = None) -> Phase:
        seconds = time.monotonic() - self.t0
        calls, cpu, used = _counters(self.client)
        before, cpu0, used0 = self.start
        delta = {k: v - before.get(k, 0) for k, v in calls.items()}
        delta.pop("config|resetstat", None)
        delta.pop("info", None)
        vms = beam.cpu_of(self.pids)
        rabbit = None if vms is None or self.beam is None else (vms - self.beam) / jobs * 1e6
        per = {k: round(v / jobs, 3) for k, v in sorted(delta.items(), key=lambda kv: -kv[1])}
        found = Phase(
            phase, self.broker, self.variant, jobs, round(seconds, 2),
            round(sum(delta.values()) / jobs, 2), None, round((cpu - cpu0) / jobs * 1e6, 1),
            None if rabbit is None else round(rabbit, 1), round((used - used0) / jobs, 1),
            {k: v for k, v in per.items() if v >= 0.01},
        )  # fmt: skip
        if trips is not None:
            sent = trips.take()
            found.redis_trips = round(sum(sent.values()) / jobs, 2)
            found.trips = {k: round(v / jobs, 2) for k, v in sent.most_common() if v / jobs >= 0.01}
        return found


#: seconds ``MONITOR``'s reader may go without reading a line before a take gives up:
#: under load it reads far behind the server, for as long as the backlog takes; only a
#: reader that stopped moving is a failure
STALL = 30.0


class Trips:
    """Counts the commands clients send (``MONITOR``: a script is one line, the
    commands it runs are marked ``lua``) from a thread, per phase. A command whose reply
    its client skipped (``CLIENT REPLY SKIP`` before it) is no round trip: the client
    writes it with the next command and waits for that one's reply only.

    ``stall``: how long the reader may read no line at all before :meth:`take` gives
    up; while it reads, however far behind, a take waits for its marker."""

    def __init__(self, port: int, stall: float = STALL, host: str = "localhost") -> None:
        import redis

        self.client = redis.Redis(host=host, port=port)
        self.stall = stall
        #: lines the reader has read (its progress, watched by :meth:`take`)
        self.lines = 0
        self._failed: BaseException | None = None
        self.count: collections.Counter[str] = collections.Counter()
        #: the (address, port) of clients whose commands are the bench's own (its poll)
        self.ignore: set[tuple[str, str]] = set()
        self._counter = TripCounter()
        self._stop = False
        self._listening = threading.Event()
        #: a phase's end: the marker ``take`` sends, and what was counted up to it
        self._marker = ""
        self._marked = threading.Event()
        self._taken: collections.Counter[str] = collections.Counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Trips:
        """Once ``MONITOR`` is listening: pings until it has seen one (a command sent
        before that would go uncounted)."""
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._listening.wait(0.05):
            self.client.ping()
            if time.monotonic() > deadline:
                raise TimeoutError("MONITOR saw nothing in 30 s")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop = True
        self.client.ping()  # one more line: the monitor loop sees the stop
        self._thread.join(5)

    def _run(self) -> None:
        try:
            with self.client.monitor() as monitor:  # type: ignore[no-untyped-call]
                for command in monitor.listen():
                    self.lines += 1
                    self._listening.set()
                    if self._stop:
                        return
                    self._line(command)
        except BaseException as exc:  # said by the next take, not lost in a thread
            self._failed = exc
            raise

    def _line(self, command: dict[str, Any]) -> None:
        line = str(command.get("command", ""))
        if self._marker and line.lower().startswith("echo") and self._marker in line:
            self._taken, self.count = self.count, collections.Counter()
            self._marked.set()
            return
        client = (str(command.get("client_address")), str(command.get("client_port")))
        if client in self.ignore:
            return
        key = self._counter.key(command)
        if key is not None:
            self.count[key] += 1

    def take(self) -> collections.Counter[str]:
        """What was counted since the last take: up to a marker (``ECHO``) sent now, so
        that the lines ``MONITOR`` has not delivered yet fall in this phase, not the next."""
        self._marker, self._marked = uuid.uuid4().hex, threading.Event()
        self.client.echo(self._marker)
        seen, moved = self.lines, time.monotonic()
        while not self._marked.wait(min(1.0, self.stall)):
            if self._failed is not None or not self._thread.is_alive():
                raise RuntimeError(f"MONITOR's reader ended: {self._failed!r}")
            if self.lines != seen:  # behind, but reading: the marker comes
                seen, moved = self.lines, time.monotonic()
            elif time.monotonic() - moved > self.stall:
                raise TimeoutError(
                    f"MONITOR's reader read nothing for {self.stall:g} s and did not "
                    "deliver the phase's marker"
                )
        return self._taken
