"""Small polling helpers for tests against real workers (bounded in time)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from kombu import Exchange, Producer

from conventions.records import AuditEvent, DeadLetter

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
