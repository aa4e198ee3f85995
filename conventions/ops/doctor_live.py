"""The doctor's live checks: which queues the running workers consume, and which
queues hold messages.

A queue that tasks route to with no consumer is a queue whose jobs wait forever (Redis
and RabbitMQ keep them without complaint); so is a beat entry that targets one. The
workers are asked with ``inspect().active_queues()``; the broker with a passive
queue declare (a message count, on Redis and RabbitMQ alike; on RabbitMQ its consumer
count too, :func:`conventions.ops.doctor_rabbitmq.live_findings`).

With the layer's Redis transport the broker also says what it holds beside the queues
(:mod:`conventions.transport.layout`): jobs not yet due, whose next due time should not
lie in the past for long (each consumer moves due jobs as it fetches), and the consumers
whose sign of life is fresh (a worker that consumes a queue without one is recovered
only by the visibility timeout: not the layer's transport, or an older layer), and
whether those consumers agree on ``recovery_timeout`` (:mod:`conventions.ops.doctor_fleet`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import QueueNotFound

from conventions.config import settings as settingslib
from conventions.config.profile import INBOX_TRANSPORT
from conventions.jobs import routing
from conventions.observability.queues import Held
from conventions.ops import doctor, doctor_fleet, doctor_rabbitmq, doctor_rabbitmq_env
from conventions.ops.doctor import ERROR, WARNING, Finding, apply_levels, user_tasks

#: seconds to wait for the workers' replies
DEFAULT_TIMEOUT = 2.0
#: how long past its due time a delayed job may stay in the delayed set of a consumed
#: queue before the doctor says nobody moves it (seconds)
OVERDUE = 60.0


@dataclass
class Live:
    """What the workers and the broker said."""

    #: worker node name -> the queues it consumes
    consumers: dict[str, list[str]] = field(default_factory=dict)
    #: queue -> messages waiting (ready, not yet delivered)
    backlog: dict[str, int] = field(default_factory=dict)
    #: queue -> what the layer's transport holds of it (empty: kombu's stock transport)
    held: dict[str, Held] = field(default_factory=dict)
    #: seconds each queue's next delayed job is overdue by (negative: still ahead)
    overdue: dict[str, float] = field(default_factory=dict)
    #: RabbitMQ: queue -> consumers the broker counts (a queue not declared is missing)
    broker_consumers: dict[str, int] = field(default_factory=dict)
    #: the layer's transport: each live consumer's ``recovery_timeout`` as its score says
    timeouts: list[doctor_fleet.Bound] = field(default_factory=list)
    #: RabbitMQ with countdowns on quorum queues: each node's dead-letter confirm timeout
    dlx_confirm: doctor_rabbitmq_env.Read | None = None

    @property
    def consumed(self) -> set[str]:
        return {queue for queues in self.consumers.values() for queue in queues}


def observe(app: Any, timeout: float = DEFAULT_TIMEOUT) -> Live:
    """Ask the workers for their queues and the broker for each declared queue's length."""
    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    consumers = {node: sorted(q["name"] for q in queues or ()) for node, queues in replies.items()}
    names = {q.name for q in app.amqp.queues.values()} | set(routed(app))
    if settingslib.is_amqp(app.conf):
        live = Live(consumers=consumers)
        for name in sorted(names | {settingslib.poison_queue(app.conf)}):
            declared = _declared(app, name)
            live.backlog[name] = declared[0] if declared else 0
            if declared is not None:
                live.broker_consumers[name] = declared[1]
        if doctor_rabbitmq_env.wanted(app.conf):
            live.dlx_confirm = doctor_rabbitmq_env.read(app.conf)
        return live
    live = Live(consumers=consumers, backlog={name: _depth(app, name) for name in sorted(names)})
    if doctor.layer_transport(app.conf):
        _read_held(app, live, timeout)
    return live


def _declared(app: Any, queue: str) -> tuple[int, int] | None:
    """A queue's ready messages and consumers by a passive declare; None when the broker
    has no such queue (or does not answer: the checks then say no consumer answered)."""
    try:
        with app.connection_for_read() as connection:
            found = connection.default_channel.queue_declare(queue=queue, passive=True)
            return int(found.message_count), int(found.consumer_count)
    except Exception:
        return None


def _read_held(app: Any, live: Live, timeout: float) -> None:
    """Fill ``live.held`` and ``live.overdue`` from the broker's Redis, the first node of
    a failover list that answers (left empty when none does: the queue checks above
    already say so)."""
    import redis

    from conventions.ops.transport_view import broker_reader

    states = None
    for url in settingslib.failover_urls(app.conf.broker_url):  # the first node that answers
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            states = broker_reader(app, client).read()
            live.timeouts = doctor_fleet.read_bounds(client)
            break
        except redis.RedisError:
            continue
        finally:
            client.close()
    if states is None:
        return
    for state in states:
        live.held[state.queue] = Held(
            state.delayed or 0, None, state.in_flight or 0, state.in_inboxes or 0,
            state.consumers_alive or 0,
        )  # fmt: skip
        if state.next_due_in is not None:
            live.overdue[state.queue] = -state.next_due_in


def routed(app: Any) -> dict[str, list[str]]:
    """Queue -> the tasks routed to it (undeclared routes are the static check's)."""
    queues: dict[str, list[str]] = {}
    for task in user_tasks(app):
        try:
            queues.setdefault(routing.routed_queue(app, task), []).append(task.name)
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
            held = f"{live.backlog.get(queue, 0)} waiting{_delayed(live, queue)}"
            yield Finding(
                ERROR, "queue-without-consumer", queue,
                f"no worker consumes it, yet {', '.join(tasks)} route there ({held}); "
                f"start a worker with -Q {queue} (or add {queue} to a worker's -Q list)",
            )  # fmt: skip
    for queue in sorted(set(live.backlog) | set(live.held)):
        waiting, delayed = live.backlog.get(queue, 0), live.held.get(queue, Held()).delayed
        if (waiting or delayed) and queue not in consumed and queue not in routes:
            yield Finding(
                ERROR, "backlog-without-consumer", queue,
                f"{waiting} messages wait{_delayed(live, queue)} and no worker consumes "
                f"this queue; start a worker with -Q {queue}, or purge it if nothing should "
                "run them",
            )  # fmt: skip
    yield from _held_findings(live, consumed)
    yield from doctor_fleet.fleet_findings(app.conf, live.timeouts)
    yield from doctor_rabbitmq.live_findings(
        app.conf, live.broker_consumers, live.backlog, set(routes)
    )
    yield from doctor_rabbitmq_env.confirm_findings(app.conf, live.dlx_confirm)
    yield from _beat_findings(app, consumed)


def _delayed(live: Live, queue: str) -> str:
    held = live.held.get(queue)
    return f", {held.delayed} delayed" if held is not None and held.delayed else ""


def _held_findings(live: Live, consumed: set[str]) -> Iterator[Finding]:
    """On the layer's transport: due jobs left in the delayed set of a consumed queue,
    and consumed queues without a consumer alive in the liveness set."""
    for queue in sorted(consumed & set(live.held)):
        late = live.overdue.get(queue)
        if late is not None and late > OVERDUE:
            yield Finding(
                WARNING, "delayed-not-moved", queue,
                f"its next delayed job has been due for {late:.0f}s and is still in the "
                "delayed set: its workers do not move due jobs; run them on the layer's "
                f"transport (broker_transport = {INBOX_TRANSPORT!r})",
            )  # fmt: skip
        if not live.held[queue].consumers_alive:
            yield Finding(
                WARNING, "consumer-not-alive", queue,
                "workers consume it but none keeps a sign of life in the transport's "
                "liveness set: a dead worker's jobs are given back only after the "
                "visibility timeout; run the workers on the layer's transport (this "
                "version of celery-conventions)",
            )  # fmt: skip


def _beat_findings(app: Any, consumed: set[str]) -> Iterator[Finding]:
    schedule = app.conf.get("beat_schedule") or {}
    for entry, spec in sorted(schedule.items()):
        name = spec.get("task")
        options = spec.get("options") or {}
        queue = options.get("queue")
        if queue is None:
            task = app.tasks.get(name)
            try:
                default = app.conf.task_default_queue
                queue = routing.routed_queue(app, task) if task is not None else default
            except QueueNotFound:
                continue
        if queue not in consumed:
            yield Finding(
                ERROR, "beat-target-unconsumed", f"beat entry {entry}",
                f"sends {name} to queue {queue!r}, which no worker consumes; start a worker "
                f"with -Q {queue} or route the task elsewhere",
            )  # fmt: skip
