"""What each parallel test worker has of its own: an index, ports, servers and names.

``make test`` runs pytest-xdist workers (``gw0``, ``gw1``, ...) side by side on one
machine. Each gets an index (:data:`INDEX`) and, from it:

- its own ``redis-server`` (:class:`OwnRedis`, port :data:`REDIS_PORT`, a folder of its
  own), started and stopped by a session fixture (:mod:`tests.fixtures`);
- its own RabbitMQ vhost (:data:`VHOST`) on the machine's node, made anew at its start;
- its own PostgreSQL databases (``tests/conftest.py`` names them with a random suffix);
- ports of its own: :func:`fixed` moves a fixed port (a Sentinel group, a Redis Cluster,
  a private RabbitMQ node) to the worker's block, and :func:`free_port` hands out a free
  port from the worker's own range, below the kernel's ephemeral range, so that no other
  worker, and no client's source port, takes it between the probe and the bind.

``TEST_SLOT=N`` moves a whole run to other indexes (``N * 8`` on), so that two runs
on one machine (two checkouts, say) share nothing either. Without xdist, a run is worker
0 of its slot.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

#: the xdist worker's name (``gw3``), or ``main`` for a run without workers
WORKER_ID = os.environ.get("PYTEST_XDIST_WORKER", "main")
#: at most this many workers in one slot
SLOT_WIDTH = 8
#: the run's slot (``TEST_SLOT``) and the worker's index on the machine
SLOT = int(os.environ.get("TEST_SLOT", "0"))
INDEX = SLOT * SLOT_WIDTH + (int(WORKER_ID[2:]) if WORKER_ID.startswith("gw") else 0)
#: how far apart two workers' fixed ports lie: more than the widest block of fixed ports
#: a test takes (Redis Cluster 7100-7125, a private RabbitMQ 5680-5714)
STRIDE = 40
#: the indexes a machine may hold (fixed blocks that never meet: see :func:`fixed`)
MAX_INDEX = 15
if INDEX > MAX_INDEX:
    raise RuntimeError(
        f"test worker index {INDEX} > {MAX_INDEX}: fewer workers or a lower TEST_SLOT"
    )

#: the worker's own redis-server (a port no fixed block reaches: those end below 8000)
REDIS_PORT = 16400 + INDEX
#: the worker's RabbitMQ vhost on the machine's node
VHOST = f"cc-test-{INDEX}"
#: the worker's range of free ports (below the ephemeral range, 32768 on)
FREE_PORTS = range(20000 + 300 * INDEX, 20300 + 300 * INDEX)
_next_free = itertools.cycle(FREE_PORTS)


def fixed(port: int) -> int:
    """``port`` moved to this worker's block: worker 0 keeps it, worker ``i`` adds
    ``i * STRIDE``. For the ports in use (5680-5714, 6400-6401, 7100-7125, 26400-26402
    and the distribution and bus ports above them) no two workers' blocks meet."""
    return port + INDEX * STRIDE


def is_free(port: int) -> bool:
    """Whether nothing listens on ``port`` of loopback (a bind to it succeeds)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free port of this worker's range, the next in turn (a port just handed out is
    not handed out again before the range comes round)."""
    for _ in FREE_PORTS:
        port = next(_next_free)
        if is_free(port):
            return port
    raise RuntimeError(f"no free port in {FREE_PORTS}")


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGTERM when the process that
    started it dies (a test worker killed with -9 leaves no server behind)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


#: prctl(2)'s option: the signal a child gets when its parent dies
PR_SET_PDEATHSIG = 1


class OwnRedis:
    """The worker's own ``redis-server``: no persistence (the machine's is the same),
    its folder a temporary one, gone with the worker even when it is killed. Its owner
    is written beside the port (``/tmp/cc-test-redis-<port>.owner``): a server on the
    port whose owner is alive belongs to another run on the same slot, and this one
    refuses to start (it never stops another run's server); one whose owner is gone is
    a leftover, shut down first."""

    def __init__(self, port: int = REDIS_PORT) -> None:
        self.port = port
        self.folder = Path(tempfile.mkdtemp(prefix=f"cc-redis-{INDEX}-"))
        self.owner = Path(tempfile.gettempdir()) / f"cc-test-redis-{port}.owner"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10) -> None:
        self._clear_the_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent,  # noqa: PLW1509
        )  # fmt: skip
        self.owner.write_text(str(os.getpid()))
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError as exc:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        log = (self.folder / "redis.log").read_text(errors="replace")
                        raise RuntimeError(
                            f"redis-server on {self.port} did not start:\n{log}"
                        ) from exc
                    time.sleep(0.05)
        finally:
            client.close()

    def _clear_the_port(self) -> None:
        if is_free(self.port):
            return
        owner = self.owner.read_text().strip() if self.owner.exists() else ""
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            raise RuntimeError(
                f"port {self.port} is taken by the test run of process {owner} on the same "
                f"slot: run this one beside it with TEST_SLOT={SLOT + 1}"
            )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            client.shutdown(nosave=True)  # a leftover of a run that is gone
        except redis.ConnectionError:
            pass  # it went away as asked
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        self.owner.unlink(missing_ok=True)
        shutil.rmtree(self.folder, ignore_errors=True)


def rabbitmqctl() -> str | None:
    """The machine's ``rabbitmqctl`` (the vhost is made through it), if any."""
    return shutil.which("rabbitmqctl")


def fresh_vhost(vhost: str = VHOST, user: str = "guest") -> None:
    """``vhost`` made anew on the machine's node (whatever an earlier run left in it is
    gone), with every permission for ``user``."""
    ctl = rabbitmqctl()
    if ctl is None:
        raise FileNotFoundError("rabbitmqctl")
    for args in (
        ["delete_vhost", vhost],
        ["add_vhost", vhost],
        ["set_permissions", "-p", vhost, user, ".*", ".*", ".*"],
    ):
        done = subprocess.run(
            [ctl, "-q", *args], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode and args[0] != "delete_vhost":
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()}")


def drop_vhost(vhost: str = VHOST) -> None:
    ctl = rabbitmqctl()
    if ctl is not None:
        subprocess.run(
            [ctl, "-q", "delete_vhost", vhost], capture_output=True, timeout=60, check=False
        )
