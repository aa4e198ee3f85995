"""What the code under test published: every message, read back from the memory broker.

The app under test publishes through its real path (``.delay()``, ``apply_async``,
``send_task``, the outbox relay, a job's children, a retry, a deferral, beat's sends), down
to kombu, on the ``memory://`` transport (:mod:`conventions.testing.isolation`). The
capture takes each message out of the in-memory queues as it was sent (headers, payload,
ETA) and keeps it as a :class:`Published`: nothing reaches a real broker, and nothing is
run until the test (or :mod:`conventions.testing.drain`) says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery.utils.time import maybe_iso8601

from conventions.testing.clock import VirtualClock
from conventions.tracing import headers as hdr


@dataclass(frozen=True)
class Published:
    """One message the code published, as the broker got it."""

    #: the task name (``email.send_receipt.v1``)
    name: str
    task_id: str
    #: the keyword arguments (a convention job's payload, as the message carries it)
    payload: dict[str, Any]
    #: the layer's headers the message carries (``cc_*``)
    headers: dict[str, Any]
    #: the idempotency key the message carries (``cc_idempotency_key``), if any
    key: str | None
    #: when it is due (virtual time; None: at once)
    eta: datetime | None
    #: the virtual time it was published at
    published_at: datetime
    #: Celery's retry count (0 on the first attempt)
    retries: int
    #: the queue it went to (the routing key)
    queue: str
    #: the kombu message itself (what the kit runs)
    message: Any = field(repr=False, compare=False)
    #: the order of publication (ties of due time run in this order)
    seq: int = 0

    @property
    def countdown(self) -> float | None:
        """Seconds between the publish and the ETA (None: due at once)."""
        if self.eta is None:
            return None
        return (self.eta - self.published_at).total_seconds()

    @property
    def attempt(self) -> int:
        """The attempt this message runs as (1 on the first run)."""
        return self.retries + 1

    @property
    def correlation_id(self) -> str | None:
        value = self.headers.get(hdr.CORRELATION)
        return str(value) if value else None

    def due_at(self) -> datetime:
        return self.eta or self.published_at

    def matches(self, name: str | None, payload: Mapping[str, Any]) -> bool:
        """Whether this is a message of task ``name`` (any, when None) whose payload has
        every field of ``payload`` with that value."""
        if name is not None and self.name != name:
            return False
        return all(k in self.payload and self.payload[k] == v for k, v in payload.items())


def task_name(task: Any) -> str | None:
    """The name of ``task`` (a task object or a name; None: any)."""
    if task is None or isinstance(task, str):
        return task
    return str(task.name)


class Capture:
    """Every message the app published while the capture was open, in order, and the
    ones not yet run (``pending``)."""

    def __init__(self, app: Any, clock: VirtualClock) -> None:
        self.app = app
        self.clock = clock
        #: every message, in publication order
        self.all: list[Published] = []
        #: the messages the kit has not run yet
        self.pending: list[Published] = []
        self._seq = itertools.count(1)
        self._connection: Any = None

    # -- the memory broker ----------------------------------------------------------------
    def queue_names(self) -> list[str]:
        names = set(self.app.amqp.queues)
        names.add(self.app.conf.task_default_queue or "celery")
        return sorted(names)

    def open(self) -> None:
        """Declare the app's queues on the memory broker and empty them."""
        self._connection = self.app.connection_for_read()
        channel = self._connection.default_channel
        for queue in self.app.amqp.queues.values():
            queue(channel).declare()
        for name in self.queue_names():
            channel.queue_purge(name)

    def close(self) -> None:
        if self._connection is None:
            return
        channel = self._connection.default_channel
        for name in self.queue_names():
            channel.queue_purge(name)
        self._connection.release()
        self._connection = None

    def collect(self, _: Any = None) -> list[Published]:
        """Take what was published since the last call out of the memory broker (at the
        current virtual time); returns the new messages."""
        if self._connection is None:
            return []
        channel = self._connection.default_channel
        new: list[Published] = []
        for name in self.queue_names():
            while (message := channel.basic_get(name, no_ack=True)) is not None:
                new.append(self._published(message, name))
        new.sort(key=lambda item: item.seq)
        self.all.extend(new)
        self.pending.extend(new)
        return new

    def _published(self, message: Any, queue: str) -> Published:
        headers = dict(message.headers or {})
        _, kwargs, _ = message.decode()
        eta = headers.get("eta")
        ours = {name: headers[name] for name in hdr.ALL_HEADERS if headers.get(name) is not None}
        key = ours.get(hdr.IDEMPOTENCY_KEY)
        return Published(
            name=str(headers.get("task")),
            task_id=str(headers.get("id")),
            payload=dict(kwargs or {}),
            headers=ours,
            key=str(key) if key else None,
            eta=maybe_iso8601(eta) if eta else None,
            published_at=self.clock.now(),
            retries=int(headers.get("retries") or 0),
            queue=str((message.delivery_info or {}).get("routing_key") or queue),
            message=message,
            seq=next(self._seq),
        )

    # -- reading ----------------------------------------------------------------------------
    def find(
        self, task: Any = None, *, pending_only: bool = False, **payload: Any
    ) -> list[Published]:
        self.collect()
        name = task_name(task)
        source = self.pending if pending_only else self.all
        return [item for item in source if item.matches(name, payload)]

    def next_due(self) -> Published | None:
        """The pending message due first (ties: the first published)."""
        self.collect()
        if not self.pending:
            return None
        return min(self.pending, key=lambda item: (item.due_at(), item.seq))

    def take(self, item: Published) -> None:
        self.pending.remove(item)

    def __iter__(self) -> Iterator[Published]:
        self.collect()
        return iter(list(self.all))

    def __len__(self) -> int:
        self.collect()
        return len(self.all)
