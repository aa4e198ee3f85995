"""RabbitMQ's quorum queues for the layer: the arguments of every workload queue, the
poison exchange and queue they dead-letter to, and the delay topology, in one place.

A queue is declared by whoever touches it first, a publisher (Celery declares the queue
of each publish) or a worker, and RabbitMQ refuses a second declaration whose arguments
differ (``PRECONDITION_FAILED``): so both sides take them from :func:`queue_arguments`.
Each workload queue is a quorum queue with a delivery limit, dead-lettering at least once
to the layer's poison exchange (:func:`poison_queue`, read by
:mod:`conventions.worker.poison_queue`), on a topic exchange of its own name: Celery's
native delayed delivery (exchanges ``celery_delayed_0..27``, kept by RabbitMQ as
messages with a TTL) routes a countdown only through exchanges that are not direct.

:func:`ensure` declares the whole topology once per process, before the first publish: a
publisher that runs before any worker started would otherwise have its delayed messages
dropped at the end of their delay (nothing bound yet), its dead letters dropped (no
poison exchange yet).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kombu import Exchange, Queue
from kombu.common import Broadcast
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from conventions.config import settings
from conventions.errors import ConfigurationError, Unroutable
from conventions.jobs import routing

#: the exchange type of the workload queues: what native delayed delivery routes through
EXCHANGE_TYPE = "topic"
#: Celery's queue type for the ``celery_delayed_*`` queues (its own default)
DELAY_QUEUE_TYPE = "quorum"
_lock = threading.Lock()
#: RabbitMQ's reply codes of a message routed nowhere: ``basic.return`` NO_ROUTE (a
#: mandatory publish no queue is bound to take), and NOT_FOUND (no such exchange)
NO_ROUTE, NOT_FOUND = 312, 404
#: RabbitMQ's reply to a declaration whose arguments differ from the existing one's
PRECONDITION_FAILED = 406


def queue_arguments(conf: Any) -> dict[str, Any]:
    """The arguments of every workload queue (publishers and workers alike)."""
    return {
        "x-queue-type": "quorum",
        # deliveries without an ack before the broker dead-letters the message
        "x-delivery-limit": settings.delivery_limit(conf),
        "x-dead-letter-exchange": settings.poison_queue(conf),
        # the dead letter is kept in this queue until the poison queue confirms it ...
        "x-dead-letter-strategy": "at-least-once",
        # ... which RabbitMQ allows only when a full queue refuses new publishes
        "x-overflow": "reject-publish",
    }


def confirms(conf: Any) -> bool:
    """Whether publishes wait for RabbitMQ's confirm (``confirm_publish``, the profile's)."""
    options = conf.get("broker_transport_options") or {}
    return bool(isinstance(options, Mapping) and options.get("confirm_publish"))


def workload_queues(conf: Any, mapping: Mapping[str, str]) -> tuple[Queue, ...]:
    """The quorum queues of a workload -> queue map (``App`` builds ``task_queues`` so)."""
    arguments = queue_arguments(conf)
    return routing.queues_for(
        mapping, exchange_type=EXCHANGE_TYPE, arguments=lambda _name: dict(arguments)
    )


def poison_queue(conf: Any) -> Queue:
    """The layer's poison queue: a quorum queue on a fanout exchange of its name (every
    dead letter, whatever its routing key). No delivery limit: its consumer holds a
    message it cannot record rather than give it back."""
    name = settings.poison_queue(conf)
    return Queue(
        name, Exchange(name, type="fanout"), routing_key=name,
        queue_arguments={"x-queue-type": "quorum"},
    )  # fmt: skip


def declare(app: Any, connection: Any) -> None:
    """Declare the poison queue, the app's queues, the delay exchanges and queues, and
    bind each queue to the delay topology (what Celery's ``DelayedDelivery`` worker step
    does too: declarations of equal arguments are idempotent)."""
    declared = [q for q in app.amqp.queues.values() if not isinstance(q, Broadcast)]
    channel = connection.channel()
    try:
        poison_queue(app.conf)(channel).declare()
        for queue in declared:
            queue(channel).declare()
        declare_native_delayed_delivery_exchanges_and_queues(connection, DELAY_QUEUE_TYPE)
        for queue in declared:
            if queue.exchange and queue.exchange.type != "direct":
                bind_queue_to_native_delayed_delivery_exchange(connection, queue)
    finally:
        channel.close()


def ensure(app: Any) -> None:
    """:func:`declare` once per app and process (the broker keeps it), on a connection of
    the app's; a broker that does not answer raises as a publish would."""
    if app.__dict__.get("_cc_amqp_topology"):
        return
    with _lock:
        if app.__dict__.get("_cc_amqp_topology"):
            return
        try:
            with app.connection_for_write() as connection:
                declare(app, connection)
        except Exception as exc:
            if getattr(exc, "reply_code", None) != PRECONDITION_FAILED:
                raise
            raise ConfigurationError(
                f"RabbitMQ refused to declare the app's queues ({' '.join(str(exc).split())}): "
                "a queue or exchange of that name exists with other arguments (a classic "
                "queue, a direct exchange); drain and delete it, or map the workload to a "
                "new queue name (docs/howto/rabbitmq.md, migrating from classic queues)"
            ) from exc
        app.__dict__["_cc_amqp_topology"] = True


def unroutable(exc: BaseException, task: str) -> Unroutable | None:
    """The :class:`~conventions.errors.Unroutable` a refused publish means, or None.

    py-amqp raises ``basic.return`` as a ``ChannelError`` when no return handler is set
    (reply code 312), and a publish to a missing exchange as ``NotFound`` (404)."""
    seen: BaseException | None = exc
    for _ in range(5):  # kombu and Celery wrap once or twice
        if seen is None:
            return None
        code = getattr(seen, "reply_code", None) or getattr(seen, "code", None)
        text = str(getattr(seen, "reply_text", "") or seen)
        if code == NO_ROUTE or (code == NOT_FOUND and "exchange" in text):
            what = "no queue is bound to take it" if code == NO_ROUTE else text
            return Unroutable(
                f"{task}: RabbitMQ routed the message nowhere ({what}): nothing was "
                "published; declare the queue (start a worker for it, or list it in "
                "task_queues) and publish again"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def whole_second_delay(options: dict[str, Any]) -> None:
    """A delay under one second made one second, in place: Celery routes a countdown
    through the delay exchanges by its whole seconds, and ``int(0.4)`` is 0, which
    kombu refuses (``calculate_routing_key``: ValueError). Later by under a second,
    never earlier; the fraction above a whole second waits in the worker (under 1 s)."""
    eta = options.get("eta")
    if isinstance(eta, datetime):
        left = (eta if eta.tzinfo else eta.replace(tzinfo=UTC)) - datetime.now(UTC)
        if 0 < left.total_seconds() < 1:
            options.pop("eta")
            options["countdown"] = 1.0
        return
    countdown = options.get("countdown")
    if isinstance(countdown, int | float) and 0 < countdown < 1:
        options["countdown"] = 1.0
