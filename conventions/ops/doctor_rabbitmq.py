"""The doctor on RabbitMQ: the workload queues' type and arguments (static), and what
a passive declare says of each queue (live).

Static (:func:`config_findings`, from the configuration alone): a workload queue that is
classic, not quorum (no delivery limit, no poison queue, delays held by workers); a
quorum queue on a direct exchange (Celery's native delayed delivery skips it: a worker
holds its countdowns, into RabbitMQ's ``consumer_timeout``); a quorum queue whose
dead-lettering is not the layer's (its poison messages would be dropped, or kept where
nobody reads them); a delivery limit at or below the layer's own poison detection (the
broker would dead-letter a job before the layer quarantines it). Publisher confirms
are a promise of the profile (``publish-unconfirmed``, :mod:`conventions.config.profile`).

Live (:func:`live_findings`): a passive ``queue.declare`` answers a queue's ready
messages and consumers; a routed queue with none, and a poison queue nobody reads, are
said. What only the management API knows (classic mirrored queues' policies, a queue's
type as declared on the broker, the unacked count, message ages) is not checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conventions.config import settings
from conventions.ops.findings import ERROR, WARNING, Finding

#: the dead-lettering every workload quorum queue needs (``amqp_queues.queue_arguments``)
STRATEGY = "at-least-once"
#: the fix of a queue that is not declared as the layer declares it
ARGUMENTS_FIX = (
    "leave task_queues unset (the App builds the workload queues from "
    "conventions_workloads), or build them with conventions.transport.amqp_queues."
    "workload_queues(app.conf, workloads)"
)


def _declared(conf: Any) -> list[Any]:
    """The declared ``task_queues`` (none: the App builds them from the profile)."""
    queues = conf.get("task_queues")
    return list(queues) if queues else []


def _arguments(queue: Any) -> Mapping[str, Any]:
    found = getattr(queue, "queue_arguments", None)
    return found if isinstance(found, Mapping) else {}


def config_findings(conf: Any) -> Iterator[Finding]:
    """The static RabbitMQ checks; nothing on another broker."""
    if not settings.is_amqp(conf):
        return
    limit = settings.delivery_limit(conf)
    claims = int(conf.get("conventions_max_deliveries") or settings.DEFAULT_MAX_DELIVERIES)
    poison = settings.poison_queue(conf)
    quorum_seen = not _declared(conf) and bool(conf.get("conventions_quorum_queues"))
    for queue in _declared(conf):
        arguments = _arguments(queue)
        if arguments.get("x-queue-type") != "quorum":
            yield Finding(
                WARNING, "classic-queue", queue.name,
                "a classic queue on RabbitMQ: no delivery limit, no poison queue (a job "
                "that keeps killing its worker is seen only by the layer's claims), and "
                "every countdown held unacked by a worker; declare it quorum "
                f"({ARGUMENTS_FIX}); an existing classic queue must be drained and "
                "deleted first (docs/howto/rabbitmq.md)",
            )  # fmt: skip
            continue
        quorum_seen = True
        exchange = getattr(getattr(queue, "exchange", None), "type", "direct")
        if exchange == "direct":
            yield Finding(
                WARNING, "direct-exchange-delays", queue.name,
                "a quorum queue on a direct exchange: Celery's native delayed delivery "
                "routes only through topic exchanges, so a worker holds every countdown "
                f"unacked until due (RabbitMQ's consumer_timeout); {ARGUMENTS_FIX}",
            )  # fmt: skip
        dlx = arguments.get("x-dead-letter-exchange")
        strategy = arguments.get("x-dead-letter-strategy")
        if dlx != poison or strategy != STRATEGY:
            yield Finding(
                ERROR, "poison-queue-missing", queue.name,
                f"dead-letters to {dlx!r} ({strategy or 'at-most-once'}), not to the layer's "
                f"poison queue {poison!r} at least once: a message past its delivery "
                f"limit is dropped or kept where nobody reads it; {ARGUMENTS_FIX}",
            )  # fmt: skip
    if quorum_seen and limit <= claims:
        yield Finding(
            WARNING, "delivery-limit-below-claims", "conventions_delivery_limit",
            f"x-delivery-limit {limit} is not above conventions_max_deliveries ({claims}): "
            "RabbitMQ dead-letters a crashing job before the layer quarantines it (with "
            f"its key, attempt and FAILURE result); keep it at {claims + 2} or more (unset: "
            f"max_deliveries + {settings.DELIVERY_LIMIT_MARGIN})",
        )  # fmt: skip


def live_findings(
    conf: Any, consumers: Mapping[str, int], backlog: Mapping[str, int], routed: set[str]
) -> Iterator[Finding]:
    """What the broker's passive declares said: ``consumers`` (queue -> the broker's
    consumer count; a queue missing from it is not declared), ``backlog`` (ready
    messages). A routed queue RabbitMQ knows no consumer of; the poison queue unread."""
    for queue in sorted(routed & set(consumers)):
        if consumers[queue] == 0:
            waiting = backlog.get(queue, 0)
            yield Finding(
                ERROR if waiting else WARNING, "rabbitmq-no-consumer", queue,
                f"RabbitMQ counts no consumer on it ({waiting} ready): its jobs wait until "
                f"a worker consumes it; start one with -Q {queue}",
            )  # fmt: skip
    poison = settings.poison_queue(conf)
    if settings.quorum_queues(conf) and consumers.get(poison) == 0:
        yield Finding(
            WARNING, "poison-queue-unconsumed", poison,
            f"nobody reads the poison queue ({backlog.get(poison, 0)} waiting): its messages "
            "do not become dead letters until a worker of this app on RabbitMQ runs (each "
            "starts a consumer of it)",
        )  # fmt: skip
