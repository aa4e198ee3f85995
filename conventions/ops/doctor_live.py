"""The doctor's live checks: which queues the running workers consume, and which
queues hold messages.

A queue that tasks route to with no consumer is a queue whose jobs wait forever (Redis
and RabbitMQ keep them without complaint); so is a beat entry that targets one. The
workers are asked with ``inspect().active_queues()``; the broker with a passive
queue declare (a message count, on Redis and RabbitMQ alike).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import QueueNotFound

from conventions.ops.doctor import ERROR, WARNING, Finding, apply_levels, queue_of, user_tasks

#: seconds to wait for the workers' replies
DEFAULT_TIMEOUT = 2.0


@dataclass
class Live:
    """What the workers and the broker said."""

    #: worker node name -> the queues it consumes
    consumers: dict[str, list[str]] = field(default_factory=dict)
    #: queue -> messages waiting (ready, not yet delivered)
    backlog: dict[str, int] = field(default_factory=dict)

    @property
    def consumed(self) -> set[str]:
        return {queue for queues in self.consumers.values() for queue in queues}


def observe(app: Any, timeout: float = DEFAULT_TIMEOUT) -> Live:
    """Ask the workers for their queues and the broker for each declared queue's length."""
    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    consumers = {node: sorted(q["name"] for q in queues or ()) for node, queues in replies.items()}
    names = {q.name for q in app.amqp.queues.values()} | set(routed(app))
    return Live(consumers=consumers, backlog={name: _depth(app, name) for name in sorted(names)})


def routed(app: Any) -> dict[str, list[str]]:
    """Queue -> the tasks routed to it (undeclared routes are the static check's)."""
    queues: dict[str, list[str]] = {}
    for task in user_tasks(app):
        try:
            queues.setdefault(queue_of(app, task), []).append(task.name)
        except QueueNotFound:
            continue
    return queues


def _depth(app: Any, queue: str) -> int:
    try:
        with app.connection_for_read() as connection:
            declared = connection.default_channel.queue_declare(queue=queue, passive=True)
            return int(declared.message_count)
    except Exception:  # no such queue yet (an empty Redis list does not exist)
        return 0


def live_checks(app: Any, live: Live) -> list[Finding]:
    """Findings from what the workers and the broker said."""
    return apply_levels(_findings(app, live), app.conf)


def _findings(app: Any, live: Live) -> Iterator[Finding]:
    consumed = live.consumed
    if not live.consumers:
        yield Finding(
            WARNING, "no-worker", "workers",
            "no worker answered; start one (celery -A <app> worker -Q <queues>) or raise --timeout",
        )  # fmt: skip
    routes = routed(app)
    for queue, tasks in sorted(routes.items()):
        if queue not in consumed:
            waiting = live.backlog.get(queue, 0)
            yield Finding(
                ERROR, "queue-without-consumer", queue,
                f"no worker consumes it, yet {', '.join(tasks)} route there ({waiting} waiting); "
                f"start a worker with -Q {queue} (or add {queue} to a worker's -Q list)",
            )  # fmt: skip
    for queue, waiting in sorted(live.backlog.items()):
        if waiting and queue not in consumed and queue not in routes:
            yield Finding(
                ERROR, "backlog-without-consumer", queue,
                f"{waiting} messages wait and no worker consumes this queue; start a worker "
                f"with -Q {queue}, or purge it if nothing should run them",
            )  # fmt: skip
    yield from _beat_findings(app, consumed)


def _beat_findings(app: Any, consumed: set[str]) -> Iterator[Finding]:
    schedule = app.conf.get("beat_schedule") or {}
    for entry, spec in sorted(schedule.items()):
        name = spec.get("task")
        options = spec.get("options") or {}
        queue = options.get("queue")
        if queue is None:
            task = app.tasks.get(name)
            try:
                queue = queue_of(app, task) if task is not None else app.conf.task_default_queue
            except QueueNotFound:
                continue
        if queue not in consumed:
            yield Finding(
                ERROR, "beat-target-unconsumed", f"beat entry {entry}",
                f"sends {name} to queue {queue!r}, which no worker consumes; start a worker "
                f"with -Q {queue} or route the task elsewhere",
            )  # fmt: skip
