"""A Redis Cluster of the bench's own: ``masters`` ``redis-server --cluster-enabled yes``
processes on loopback, no replicas, no persistence (the CPU figures are the commands',
not an AOF's), each holding an equal contiguous range of the 16,384 slots.

``redis-cli --cluster create`` refuses fewer than three masters, so the slots are
assigned here (``CLUSTER ADDSLOTSRANGE``) and the nodes joined with ``CLUSTER MEET``:
the same layout for one master as for three, so the two measure alike.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import redis

#: the slots of a Redis Cluster
SLOTS = 16384
#: the bench's cluster ports (the tests' are 7100-7115)
FIRST_PORT = 7200


def url(ports: list[int]) -> str:
    """The store URL of the cluster on ``ports``."""
    return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/"


def ranges(masters: int) -> list[tuple[int, int]]:
    """The slot range (first, last) of each master: equal and contiguous."""
    return [(i * SLOTS // masters, (i + 1) * SLOTS // masters - 1) for i in range(masters)]


def _ping(node: redis.Redis, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            node.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _ok(node: redis.Redis, masters: int) -> bool:
    text = node.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
    info = text.decode() if isinstance(text, bytes) else str(text)
    fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
    return (
        fields.get("cluster_state") == "ok"
        and int(fields.get("cluster_known_nodes", 0)) == masters
        and int(fields.get("cluster_slots_ok", 0)) == SLOTS
    )


@contextlib.contextmanager
def running(masters: int, first_port: int = FIRST_PORT) -> Iterator[list[int]]:
    """The ports of a started cluster of ``masters`` masters, stopped afterwards."""
    with started(masters, first_port) as procs:
        yield [port for port, _ in procs]


@contextlib.contextmanager
def started(
    masters: int, first_port: int = FIRST_PORT, wrap: Sequence[str] = ()
) -> Iterator[list[tuple[int, int]]]:
    """Each master's (port, process id) of a started cluster, stopped afterwards (SIGTERM:
    a clean shutdown). ``wrap`` runs each ``redis-server`` under a command (``valgrind
    ...``, with ``{port}`` replaced by the master's port)."""
    folder = Path(tempfile.mkdtemp(prefix="cc-bench-cluster-"))
    ports = [first_port + i for i in range(masters)]
    procs = []
    try:
        for port in ports:
            data = folder / str(port)
            data.mkdir()
            procs.append(subprocess.Popen(
                [*(w.replace("{port}", str(port)) for w in wrap),
                 "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            ))  # fmt: skip
        nodes = [redis.Redis(port=port) for port in ports]
        for node, (first, last) in zip(nodes, ranges(masters), strict=True):
            _ping(node)
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)  # type: ignore[no-untyped-call]
        for node in nodes[1:]:
            node.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0])  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + 180
        while not all(_ok(node, masters) for node in nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {masters}-master cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        for node in nodes:
            node.close()
        yield [(port, proc.pid) for port, proc in zip(ports, procs, strict=True)]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
