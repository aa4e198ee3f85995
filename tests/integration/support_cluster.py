"""A real Redis Cluster of the tests' own: ``redis-server --cluster-enabled yes``
processes on loopback (ports from 7100; each run its own folder under
``/tmp/cc-cluster-*``), joined by ``redis-cli --cluster create``, stopped at the end.

The store contract runs on three masters (:func:`redis_cluster`, a session fixture of
``tests/conftest.py``); the chaos run starts three masters and three replicas on ports
of its own and kills a master (:meth:`Cluster.kill`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.isolation import fixed

#: the contract suite's cluster: three masters, no replicas (``TEST_CLUSTER_PORTS=7300,
#: 7301,7302`` gives a run ports of its own beside others on a machine)
CONTRACT_PORTS = tuple(
    int(port)
    for port in os.environ.get(
        "TEST_CLUSTER_PORTS", f"{fixed(7100)},{fixed(7101)},{fixed(7102)}"
    ).split(",")
)
#: milliseconds before a master that does not answer is failed over by its replica
NODE_TIMEOUT_MS = 1000


def url(ports: tuple[int, ...], query: str = "") -> str:
    """The store URL of a cluster on ``ports``."""
    nodes = ",".join(f"127.0.0.1:{port}" for port in ports)
    return f"redis+cluster://{nodes}/{'?' + query if query else ''}"


class Cluster:
    """The cluster's ``redis-server`` processes (``replicas`` per master)."""

    def __init__(self, ports: tuple[int, ...], replicas: int = 0) -> None:
        self.ports, self.replicas = ports, replicas
        self.folder = Path(tempfile.mkdtemp(prefix="cc-cluster-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> Cluster:
        try:
            for port in self.ports:
                if _listening(port):
                    raise RuntimeError(f"port {port} is taken: a cluster is running already")
            for port in self.ports:
                self._start_server(port)
            for port in self.ports:
                _ping(port)
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *nodes,
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            self.wait_ok()
            return self
        except BaseException:
            self.stop()
            raise

    def _start_server(self, port: int) -> None:
        data = self.folder / str(port)
        data.mkdir(exist_ok=True)
        log = (self.folder / f"{port}.log").open("ab")
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no",
             "--repl-diskless-sync-delay", "0"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=data,
        )  # fmt: skip
        log.close()

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node says ``cluster_state:ok`` and its replicas are online."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._ok(port) for port in self.live()):
                return
            time.sleep(0.1)
        raise AssertionError("the cluster did not reach cluster_state:ok")

    def _ok(self, port: int) -> bool:
        with (
            contextlib.suppress(redis.RedisError),
            redis.Redis(port=port, socket_timeout=2) as node,
        ):
            info = node.execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
            replication = node.info("replication")
            if replication.get("role") == "slave":
                return replication.get("master_link_status") == "up"
            return True
        return False

    def live(self) -> list[int]:
        return [port for port, proc in self.procs.items() if proc.poll() is None]

    def masters(self) -> list[int]:
        """The ports of the live masters that hold slots."""
        found = []
        for port in self.live():
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port) as node:
                if node.info("replication").get("role") == "master":
                    found.append(port)
        return found

    def kill(self, port: int) -> None:
        """kill -9 one node."""
        proc = self.procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0], decode_responses=True)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def running(ports: tuple[int, ...], replicas: int = 0) -> Iterator[Cluster]:
    """A started cluster, stopped (and its folder removed) afterwards."""
    cluster = Cluster(ports, replicas).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _ping(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(redis.RedisError),
            redis.Redis(port=port, socket_timeout=1) as node,
        ):
            if node.ping():
                return
        time.sleep(0.05)
    raise AssertionError(f"redis-server on {port} did not start")


def restart(cluster: Cluster, port: int) -> None:
    """Start a killed node again from its folder (its ``nodes.conf``): it rejoins as a
    replica of the master that replaced it, as a supervisor would bring it back."""
    cluster._start_server(port)
    _ping(port)
