"""Small polling helpers for tests against real workers (bounded in time)."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from kombu import Exchange, Producer

from conventions.store.records import AuditEvent, DeadLetter
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.isolation import free_port

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float = 30, every: float = 0.1) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(every)


def http_status(request: str | urllib.request.Request, timeout: float) -> int:
    """The status of one HTTP call; an HTTP error is raised (the default decisions table
    classifies it) with its socket released at once."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # its status and headers stay readable
        raise


def events_of(task_id: str) -> list[AuditEvent]:
    """The audit events of one job (its correlation id is read from the store)."""
    from tasks import app

    store = app.store
    for record in store.list_dead_letters(limit=1000):
        if record.task_id == task_id and record.correlation_id:
            return [e for e in store.audit_for(record.correlation_id) if e.task_id == task_id]
    return []


def dead_letter_of(task_id: str) -> DeadLetter | None:
    from tasks import app

    for record in app.store.list_dead_letters(limit=1000):
        if record.task_id == task_id:
            return record
    return None


def publish_foreign(
    producer: Producer,
    task: str,
    kwargs: dict[str, Any],
    queue: str,
    headers: dict[str, Any] | None = None,
    *,
    task_id: str | None = None,
) -> str:
    """Publish like a foreign producer: raw kombu, Celery protocol 2, none of our headers
    (or ``headers``, say a forged ``cc_idempotency_key``); returns the task id."""
    task_id = task_id or str(uuid.uuid4())
    producer.publish(
        [[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
        exchange=Exchange(queue, type="direct"),
        routing_key=queue,
        serializer="json",
        headers={
            "lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None,
            "group": None, "retries": 0, "eta": None, "expires": None,
            "timelimit": [None, None], "argsrepr": "()", "kwargsrepr": repr(kwargs),
            "origin": "foreign", **(headers or {}),
        },
    )  # fmt: skip
    return task_id


class Events:
    """The task events a real Celery event receiver gets (what Flower reads)."""

    def __init__(self) -> None:
        from tasks import app

        self.seen: list[dict[str, Any]] = []
        self._connection = app.connection()
        self.receiver = app.events.Receiver(self._connection, handlers={"*": self.seen.append})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # the connection closed under it: stopped
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def of(self, task_id: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in list(self.seen) if e.get("uuid") == task_id and e["type"] == kind]

    def __enter__(self) -> Events:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.receiver.should_stop = True
        self._thread.join(10)
        self._connection.release()


class SentEvents:
    """The ``task-sent`` events published on the broker at ``url`` (the tests' own by
    default) while the block runs, decoded: a subscriber of the server's own, subscribed
    before the block, as Flower is."""

    def __init__(self, url: str = f"{REDIS_BASE}/{BROKER_DB}") -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()

    def __enter__(self) -> SentEvents:
        self.pubsub.psubscribe("*celeryev/task.sent")
        assert self.pubsub.get_message(timeout=5)["type"] == "psubscribe"  # type: ignore[index]
        return self

    def __exit__(self, *_: object) -> None:
        self.pubsub.close()
        self.client.close()

    def received(self, about: str, settle: float = 0.5) -> list[dict[str, Any]]:
        """The events whose kwargs name ``about`` (a worker of another test may publish
        too), received until no event came for ``settle`` seconds."""
        found, deadline = [], time.monotonic() + settle
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.1)
            if message and message["type"] == "pmessage":
                event = json.loads(base64.b64decode(json.loads(message["data"])["body"]))
                if about in str(event.get("kwargs")):
                    found.append(event)
                deadline = time.monotonic() + settle
        return found


class Monitor:
    """The commands the Redis server runs while the block runs (``MONITOR``)."""

    def __init__(self) -> None:
        self.client = redis.Redis.from_url(f"{REDIS_BASE}/{BROKER_DB}")
        self.lines: list[dict[str, Any]] = []
        self._monitor = self.client.monitor()
        self._connection = self._monitor.__enter__()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        try:
            for line in self._connection.listen():
                self.lines.append(line)
                if self._stop.is_set() and "cc-monitor-stop" in line["command"]:
                    return
        except redis.ConnectionError:
            return

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self.client.echo("cc-monitor-stop")
        self._thread.join(10)
        self._connection.connection.disconnect()
        self.client.close()

    def top_level(self, about: str) -> list[str]:
        """The commands that clients sent (not those scripts ran) and that name ``about``:
        other clients of the server (another test run, say) do not count."""
        return [line["command"].split()[0].upper() for line in self.lines
                if line.get("client_type") != "lua" and about in line["command"]]  # fmt: skip

    def scripted(self, about: str) -> list[str]:
        return [line["command"].split()[0].upper() for line in self.lines
                if line.get("client_type") == "lua" and about in line["command"]]  # fmt: skip


class SpareRedis:
    """A Redis server of the test's own on a spare port, to stop and start again (a
    store or broker that is really down, never a mock)."""

    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", *auth],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, password=self.password)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class CutProxy:
    """A TCP proxy in front of a real server (Redis, PostgreSQL) that a test can cut.

    While cut, every connection it carried is closed and each new one is accepted and
    closed at once (a server gone away, its port still taken); ``refused`` counts those,
    so a test can wait until a client really tried. ``cut_after(marker)`` cuts right
    after the reply to the first request whose bytes contain ``marker``: the next call
    of that client finds the server gone, whichever call it is.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self.refused = 0
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def url(self, scheme: str, path: str = "") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def cut(self) -> None:
        """Close every carried connection and refuse new ones until :meth:`restore`."""
        self._cut.set()
        with self._lock:
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            for sock in pair:
                _close(sock)

    def cut_after(self, marker: bytes) -> None:
        self._marker = marker

    def restore(self) -> None:
        self._marker = None
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            armed = threading.Event()
            for source, sink, up in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(
                    target=self._pump, args=(source, sink, up, armed), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, up: bool, armed: Any) -> None:
        try:
            while chunk := source.recv(65536):
                marker = self._marker
                if up and marker is not None and marker in chunk:
                    self._marker = None
                    armed.set()
                sink.sendall(chunk)
                if not up and armed.is_set():
                    self.cut()
                    return
        except OSError:
            pass
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
