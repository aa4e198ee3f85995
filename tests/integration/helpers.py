"""Small polling helpers for tests against real workers (bounded in time)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from kombu import Exchange, Producer

from conventions.records import AuditEvent, DeadLetter
from tests.conftest import BROKER_DB, REDIS_BASE

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


def publish_foreign(producer: Producer, task: str, kwargs: dict[str, Any], queue: str) -> str:
    """Publish like a foreign producer: raw kombu, Celery protocol 2, none of our headers;
    returns the task id."""
    task_id = str(uuid.uuid4())
    producer.publish(
        [[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
        exchange=Exchange(queue, type="direct"),
        routing_key=queue,
        serializer="json",
        headers={
            "lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None,
            "group": None, "retries": 0, "eta": None, "expires": None,
            "timelimit": [None, None], "argsrepr": "()", "kwargsrepr": repr(kwargs),
            "origin": "foreign",
        },
    )  # fmt: skip
    return task_id


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
