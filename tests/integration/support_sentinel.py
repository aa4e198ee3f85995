"""A real Redis Sentinel group of the tests' own: one primary, one replica, three
sentinels (``ccmaster``), on ports 6400-6401 and 26400-26402 (each run its own folder
under ``/tmp/cc-sentinel-*``), stopped at the end. Also the settings a worker or a
publisher on it uses, and the worker app module (``celery -A
tests.integration.support_sentinel worker``).

Until :func:`conventions.config.profile.reliable` configures a ``sentinel://`` broker
itself, :func:`sentinel_conf` builds the profile for the group's first primary and
points the broker, the result backend and the store at the group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from tests.isolation import fixed

MASTER = "ccmaster"
#: this test worker's block (:func:`tests.isolation.fixed`)
PORTS = (fixed(6400), fixed(6401))
SENTINEL_PORTS = (fixed(26400), fixed(26401), fixed(26402))
SENTINELS = ";".join(f"sentinel://127.0.0.1:{port}" for port in SENTINEL_PORTS)
#: milliseconds a sentinel waits before it says the primary is down, and the failover bound
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


def broker_url(db: int = 0) -> str:
    """The group's URL with ``db`` on every part (kombu and Celery read the first)."""
    return ";".join(f"sentinel://127.0.0.1:{port}/{db}" for port in SENTINEL_PORTS)


def store_url(db: int = 1, min_replicas: int = 1, wait_ms: int = 1000) -> str:
    query = f"master_name={MASTER}&min_replicas={min_replicas}&replica_wait_ms={wait_ms}"
    return f"{broker_url(db)}?{query}"


class Group:
    """The primary, the replica and the sentinels, as subprocesses."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or Path(tempfile.mkdtemp(prefix="cc-sentinel-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._owned_folder = folder is None

    def _start(self, port: int, *args: str) -> None:
        log = (self.folder / f"{port}.log").open("ab")
        self.procs[port] = subprocess.Popen(
            ["redis-server", *args], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=self.folder,
        )  # fmt: skip
        log.close()

    def start_server(self, port: int, replica_of: int | None = None) -> None:
        data = self.folder / str(port)
        data.mkdir(exist_ok=True)
        follow = ["--replicaof", "127.0.0.1", str(replica_of)] if replica_of else []
        self._start(
            port, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--daemonize", "no", "--repl-diskless-sync-delay", "0", *follow,
        )  # fmt: skip
        _ping(port)

    def start(self) -> Group:
        try:
            return self._start_all()
        except BaseException:
            self.stop()
            raise

    def _start_all(self) -> Group:
        for port in (*PORTS, *SENTINEL_PORTS):
            if _listening(port):
                raise RuntimeError(f"port {port} is taken: a Sentinel group is running already")
        primary, replica = PORTS
        self.start_server(primary)
        self.start_server(replica, replica_of=primary)
        for port in SENTINEL_PORTS:
            conf = self.folder / f"sentinel-{port}.conf"
            # each knows the replica and the other sentinels from the start: no wait for
            # the 10 s INFO refresh and the 2 s hellos before a failover can be voted
            known = "".join(
                f"sentinel known-sentinel {MASTER} 127.0.0.1 {other} {_sentinel_id(other)}\n"
                for other in SENTINEL_PORTS
                if other != port
            )
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel myid {_sentinel_id(port)}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
                f"sentinel known-replica {MASTER} 127.0.0.1 {replica}\n{known}"
            )
            self._start(port, str(conf), "--sentinel")
        for port in SENTINEL_PORTS:
            _ping(port)
        self.wait_replicated()
        self.wait_sentinels_agree()
        return self

    def primary(self) -> int:
        """The port the sentinels name as the primary now."""
        with redis.Redis(port=SENTINEL_PORTS[0], socket_timeout=2) as node:
            _, port = node.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        return int(port)

    def replica(self) -> int:
        return next(port for port in PORTS if port != self.primary())

    def wait_replicated(self, timeout: float = 20) -> None:
        """Until the primary has a replica online."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(redis.RedisError),
                redis.Redis(port=self.primary(), socket_timeout=2) as primary,
            ):
                info = primary.info("replication")
                if info.get("slave0", {}).get("state") == "online":
                    return
            time.sleep(0.1)
        raise AssertionError("the replica did not come online")

    def wait_sentinels_agree(self, timeout: float = 20) -> None:
        """Until every sentinel knows the other two and the replica (a failover needs it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = True
            for port in SENTINEL_PORTS:
                with redis.Redis(port=port, socket_timeout=2, decode_responses=True) as node:
                    master = node.execute_command("SENTINEL", "MASTER", MASTER)
                    facts = _pairs(master)
                    if int(facts["num-other-sentinels"]) < 2 or int(facts["num-slaves"]) < 1:
                        ready = False
            if ready:
                return
            time.sleep(0.2)
        raise AssertionError("the sentinels did not discover each other")

    def failover(self) -> tuple[int, float]:
        """``SENTINEL FAILOVER``: the replica becomes the primary; answers the old
        primary's port and when (``time.monotonic()``) the failover was asked for."""
        old = self.primary()
        deadline = time.monotonic() + 20
        with redis.Redis(port=SENTINEL_PORTS[0], socket_timeout=5) as node:
            while True:
                try:
                    node.execute_command("SENTINEL", "FAILOVER", MASTER)
                    return old, time.monotonic()
                except redis.ResponseError as exc:  # a replica not seen as good yet
                    if time.monotonic() > deadline or "INPROG" in str(exc):
                        raise
                    time.sleep(0.2)

    def kill_primary(self) -> tuple[int, float]:
        """``kill -9`` of the primary; answers its port and when it died."""
        old = self.primary()
        proc = self.procs.pop(old)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return old, time.monotonic()

    def wait_new_primary(self, old: int, timeout: float = 30) -> int:
        """Until the sentinels name another primary, which answers as one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                port = self.primary()
                if port != old:
                    with redis.Redis(port=port, socket_timeout=2) as node:
                        if node.info("replication")["role"] == "master":
                            return port
            time.sleep(0.05)
        raise AssertionError("no new primary within the bound")

    def restart_as_replica(self, port: int) -> None:
        """Start a killed server again (the sentinels make it a replica of the new one)."""
        self.start_server(port, replica_of=self.primary())

    def stop(self) -> None:
        for proc in list(self.procs.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.procs.clear()
        if self._owned_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _sentinel_id(port: int) -> str:
    """A fixed 40-hex-digit id per sentinel, so that each can name the others."""
    return f"{port:040x}"


def _pairs(reply: Any) -> dict[str, Any]:
    """A ``SENTINEL MASTER`` reply as a mapping (redis-py parses it, or not)."""
    if isinstance(reply, dict):
        return {str(k).replace("_", "-"): v for k, v in reply.items()}
    return dict(zip(reply[::2], reply[1::2], strict=False))


def _listening(port: int) -> bool:
    """Whether something accepts connections on ``port`` (one try: redis-py would retry
    a refused connection for seconds)."""
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _ping(port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not _listening(port):
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on {port}")
        time.sleep(0.02)
    with redis.Redis(port=port, socket_connect_timeout=1) as node:
        while True:
            try:
                if node.ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)


@contextlib.contextmanager
def sentinel_group() -> Iterator[Group]:
    group = Group()
    try:
        yield group.start()
    finally:
        group.stop()


def sentinel_conf(
    broker_db: int = 0, store_db: int = 1, *, min_replicas: int = 1, recovery: float = 6.0
) -> dict[str, Any]:
    """The reliable profile on the group: the layer's transport on the current primary,
    publishes and store writes waiting for one replica, results through Sentinel."""
    from conventions.config.profile import reliable

    return reliable(
        broker_url=broker_url(broker_db),
        store_url=store_url(store_db, min_replicas),
        recovery_timeout=recovery,
        broker_transport_options={"master_name": MASTER, "min_replicas": min_replicas,
                                  "replica_wait_ms": 1000},
    )  # fmt: skip


def _worker_app() -> Any:
    """``tasks``' app on the group (``celery -A tests.integration.support_sentinel``);
    the environment says which databases (``SENTINEL_BROKER_DB``, ``SENTINEL_STORE_DB``)."""
    from tasks import app as shop

    conf = sentinel_conf(
        int(os.environ.get("SENTINEL_BROKER_DB", "0")),
        int(os.environ.get("SENTINEL_STORE_DB", "1")),
        min_replicas=int(os.environ.get("SENTINEL_MIN_REPLICAS", "1")),
        recovery=float(os.environ.get("CONVENTIONS_RECOVERY_TIMEOUT") or 6),
    )
    shop.conf.update(conf)
    return shop


def publish_main(count: int, patience: float, hold: int = 0, go: str = "") -> None:
    """The publisher process on the group: one payment job per event ``evt_0001``..,
    each tried again while it is refused (a failover under way) for ``patience``
    seconds; prints, as JSON, the events acknowledged (``.delay()`` returned) and the
    refusals seen. ``hold`` and ``go``: see
    :func:`tests.acceptance.support_cluster_chaos.publish_events`."""
    from tests.acceptance.support_cluster_chaos import publish_events

    _worker_app()
    print(json.dumps(publish_events(count, patience, hold, go)), flush=True)


def __getattr__(name: str) -> Any:
    if name in ("app", "celery"):
        return _worker_app()
    raise AttributeError(name)


if __name__ == "__main__":
    from tests.acceptance.support_cluster_chaos import arguments

    publish_main(*arguments(sys.argv))
