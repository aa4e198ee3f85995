"""Workloads -> queues.

A task declares its *workload* (``email``, ``light``, ``heavy``...), never its queue:
the mapping from workloads to queues lives in one setting, ``conventions_workloads``,
and both ``task_routes`` and ``task_queues`` are built from it (by ``App`` itself when
the configuration sets neither). Task-level ``queue=``
is deprecated in Celery 5.7, and a queue named in code is a queue nobody may consume.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kombu import Exchange, Queue

from conventions.jobs import priority

#: the workloads known when a project declares none: two lanes, light and heavy
DEFAULT_WORKLOADS: Mapping[str, str] = {"email": "email", "light": "email", "heavy": "heavy"}


def workloads(conf: Any) -> Mapping[str, str]:
    """The workload -> queue map of an app's configuration."""
    value = conf.get("conventions_workloads") if hasattr(conf, "get") else None
    return value or DEFAULT_WORKLOADS


def queues_for(
    mapping: Mapping[str, str],
    *,
    exchange_type: str = "direct",
    arguments: Callable[[str], dict[str, Any]] | None = None,
) -> tuple[Queue, ...]:
    """Durable queues, one per distinct queue name, in a stable order, each bound to an
    exchange of its own name with its name as routing key: direct by default; on
    RabbitMQ's quorum queues, topic exchanges and ``arguments(name)`` as the queue
    arguments (``conventions.transport.amqp_queues``, the one place they are built)."""
    names = sorted(set(mapping.values()))
    return tuple(
        Queue(
            name,
            Exchange(name, type=exchange_type),
            routing_key=name,
            queue_arguments=arguments(name) if arguments is not None else None,
        )
        for name in names
    )


def routed_queue(app: Any, task: Any) -> str:
    """The queue Celery's router sends ``task`` to (its routes, then the default queue);
    raises ``QueueNotFound`` for an undeclared one."""
    route = app.amqp.router.route({}, task.name, (), {}, task_type=task)
    queue = route.get("queue")
    return str(getattr(queue, "name", queue))


class WorkloadRouter:
    """A Celery router: sends each convention task to its workload's queue.

    Used as ``task_routes = (WorkloadRouter(WORKLOADS),)``; tasks without a declared
    workload fall through to Celery's other routes and the default queue. A job with a
    priority level (its own, else its workload's: :mod:`conventions.jobs.priority`) is
    routed with that level's message priority on the app's broker; a call's own
    ``priority=`` wins over the route's.
    """

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.mapping = dict(mapping)

    def __call__(
        self,
        name: str,
        args: Any,
        kwargs: Any,
        options: Any,
        task: Any = None,
        **kw: Any,
    ) -> dict[str, Any] | None:
        workload = getattr(task, "workload", None)
        if workload is None:
            return None
        queue = self.mapping.get(workload)
        if queue is None:
            return None
        route: dict[str, Any] = {"queue": queue, "routing_key": queue}
        level = priority.level_of(task, workload)
        if level is not None:
            route["priority"] = priority.message_priority(task.app.conf, level)
        return route
