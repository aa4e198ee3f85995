"""A RabbitMQ node of the test's own, which the chaos test may stop and start again.

The machine's RabbitMQ is shared (other runs use it): a test that restarts a broker
restarts this one instead, a second node of the same installation with its own name,
ports, database folder, log folder and Erlang cookie (``HOME`` is its folder), started
with ``rabbitmq-server -detached`` and driven with ``rabbitmqctl -n``. Its listener is
loopback only; guest/guest on vhost ``/``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.isolation import fixed, is_free

#: where the Debian package keeps the scripts that run as the calling user (the ones in
#: /usr/sbin switch to the rabbitmq user, who cannot write the test's folder)
SCRIPTS = Path("/usr/lib/rabbitmq/bin")
#: the AMQP ports a private node may take (its distribution port is this + 20000);
#: ``TEST_RABBIT_PORTS=5720-5729`` gives a run ports of its own beside others on a machine
_FIRST, _, _LAST = os.environ.get("TEST_RABBIT_PORTS", f"{fixed(5680)}-{fixed(5689)}").partition(
    "-"
)
PORTS = range(int(_FIRST), int(_LAST or _FIRST) + 1)
DIST_OFFSET = 20000
#: seconds a start may take (a cold node starts in about 6 s on this machine)
START_TIMEOUT = 90


def _binary(name: str) -> str | None:
    own = SCRIPTS / name
    return str(own) if own.exists() else shutil.which(name)


def installed() -> bool:
    return _binary("rabbitmq-server") is not None and _binary("rabbitmqctl") is not None


def free_port() -> int:
    """An AMQP port of :data:`PORTS` whose distribution port is free too."""
    for port in PORTS:
        if is_free(port) and is_free(port + DIST_OFFSET):
            return port
    raise RuntimeError(f"no free port for a private RabbitMQ node in {PORTS}")


@dataclass(frozen=True)
class Queue:
    """One queue as ``rabbitmqctl list_queues`` shows it."""

    name: str
    ready: int
    unacked: int
    consumers: int

    @property
    def messages(self) -> int:
        return self.ready + self.unacked


class RabbitNode:
    """A private ``rabbitmq-server`` node in ``folder`` on ``port``."""

    def __init__(
        self,
        folder: Path,
        port: int | None = None,
        home: Path | None = None,
        conf: str = "",
        advanced: str = "",
    ) -> None:
        server, ctl = _binary("rabbitmq-server"), _binary("rabbitmqctl")
        if server is None or ctl is None:
            raise RuntimeError("rabbitmq-server is not installed: the test needs its own node")
        self.server, self.ctl_binary = server, ctl
        self.folder = folder
        #: where its Erlang cookie is (``HOME``): a cluster's nodes share one
        self.home = home or folder
        self.port = port or free_port()
        self.name = f"cc{self.port}@localhost"
        self.restarts = 0
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
            "log.file.level = warning\n" + conf
        )  # fmt: skip
        #: Erlang terms for settings ``rabbitmq.conf`` has no key for (``advanced.config``)
        (folder / "advanced.config").write_text(advanced or "[].\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def pid_file(self) -> Path:
        return self.folder / "node.pid"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(self.home),  # its own Erlang cookie
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.port + DIST_OFFSET),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.folder / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        })  # fmt: skip
        return env

    def ctl(self, *args: str, timeout: float = 60) -> str:
        """``rabbitmqctl -n <node> ...``; its output, or RuntimeError with it."""
        done = subprocess.run(
            [self.ctl_binary, "-n", self.name, *args], env=self.env(), capture_output=True,
            text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def start(self) -> None:
        """Start the node (again, on the same database) and wait until it serves."""
        subprocess.run(
            [self.server, "-detached"], env=self.env(), capture_output=True, timeout=30,
            check=True,
        )  # fmt: skip
        waited = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.ctl("wait", str(self.pid_file), "--timeout", str(START_TIMEOUT),
                         timeout=START_TIMEOUT + 10)  # fmt: skip
                break
            except RuntimeError as exc:
                # the server writes its pid file while rabbitmqctl reads it: an empty or
                # half-written file is "garbage", not a failed start (seen in a chaos run)
                if "garbage_in_pid_file" not in str(exc) or time.monotonic() > waited:
                    raise
                time.sleep(0.2)
        deadline = time.monotonic() + 30
        while not self._listening():
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ node {self.name} does not listen on {self.port}")
            time.sleep(0.1)

    def _listening(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        """Stop the whole node (Erlang VM included): its clients lose their connections."""
        if self.pid_file.exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.ctl("stop", str(self.pid_file), timeout=90)

    def restart(self, down: float = 1.0) -> None:
        """Stop the node, stay down ``down`` seconds, start it again: durable queues and
        their persistent messages come back from its database."""
        self.stop()
        time.sleep(down)
        self.start()
        self.restarts += 1

    def queues(self) -> dict[str, Queue]:
        """Every queue of vhost ``/``: ready and unacknowledged messages, consumers."""
        out = self.ctl(
            "list_queues", "-q", "--no-table-headers", "name", "messages_ready",
            "messages_unacknowledged", "consumers",
        )  # fmt: skip
        found: dict[str, Queue] = {}
        for line in out.splitlines():
            fields = line.split()
            if len(fields) == 4 and fields[1].isdigit():
                name, ready, unacked, consumers = fields
                found[name] = Queue(name, int(ready), int(unacked), int(consumers))
        return found

    def queue_type(self, name: str) -> str | None:
        """``classic``, ``quorum`` or ``stream``; None when there is no such queue."""
        out = self.ctl("list_queues", "-q", "--no-table-headers", "name", "type")
        types = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
        return types.get(name)


@contextlib.contextmanager
def private_node(folder: Path) -> Iterator[RabbitNode]:
    """A started :class:`RabbitNode`, stopped after (its files stay in ``folder``)."""
    node = RabbitNode(folder)
    node.start()
    try:
        yield node
    finally:
        node.stop()
