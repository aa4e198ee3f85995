"""The doctor on time: which broker and transport, and the bounds each one puts on time
limits, countdowns and recovery.

The layer's Redis transport (``conventions.transport.redis:Transport``) keeps delays in
Redis (any length) and gives a dead consumer's jobs back when its sign of life lapses,
within ``recovery_timeout``: its checks are on that bound (:func:`recovery_findings`).
kombu's stock Redis transport holds delayed messages unacked in the workers and recovers
by the visibility timeout: there the time limits, retry caps and
``conventions_max_countdown`` must stay below that timeout. RabbitMQ closes a channel
whose delivery stays unacked beyond its ``consumer_timeout``; its quorum queues keep
delays in the broker (Celery's native delayed delivery), and
:mod:`conventions.ops.doctor_rabbitmq` checks their type and arguments.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conventions.config import profile
from conventions.config import settings as settingslib
from conventions.ops import (
    doctor_cluster,
    doctor_rabbitmq,
    doctor_rabbitmq_cluster,
    doctor_sentinel,
)
from conventions.ops.findings import ERROR, WARNING, Finding
from conventions.transport.checks import BOUND_FACTOR, MAX_BOUND, MAX_RECOVERY

#: RabbitMQ's default ``consumer_timeout``: an unacked delivery older than this closes
#: the channel (seconds)
RABBITMQ_CONSUMER_TIMEOUT = 1800.0
#: the transport's ``recovery_timeout`` when ``broker_transport_options`` gives none
DEFAULT_RECOVERY = 30.0
#: a live consumer renews its sign of life every ``recovery_timeout / RENEWALS`` seconds
RENEWALS = 3
#: below this bound a pause of the worker (a fork, a long GC) or of Redis (an fsync
#: stall, a failover) may outlast it: a live consumer's jobs would be run a second time
MIN_RECOVERY = 5.0
#: kombu's block per fetch (``polling_interval``) and the layer's longest wait on one
#: list of several (``fetch_wait_max``) when the transport options give none (seconds)
DEFAULT_BLOCK = 5.0
DEFAULT_FETCH_WAIT_MAX = 5.0
#: without ``polling_interval`` the block is at most ``recovery_timeout`` / this
#: (:data:`conventions.transport.redis.IDLE_BLOCK_SHARE`)
BLOCK_SHARE = 6


def broker_kind(conf: Any) -> str:
    """``redis``, ``amqp`` or the broker URL's scheme (see
    :func:`conventions.config.profile.broker_kind`)."""
    return profile.broker_kind(conf.get("broker_url"))


def _options(conf: Any) -> Mapping[str, Any]:
    options = conf.get("broker_transport_options")
    return options if isinstance(options, Mapping) else {}


def visibility_timeout(conf: Any) -> float:
    return float(_options(conf).get("visibility_timeout", settingslib.CELERY_REDIS_VISIBILITY))


def layer_transport(conf: Any) -> bool:
    """Does ``conf`` run the layer's Redis transport (delays kept in Redis, recovery by
    liveness), rather than kombu's stock one (delays held by workers, recovery by the
    visibility timeout)?"""
    return broker_kind(conf) == "redis" and settingslib.delayed_delivery(conf)


def recovery_timeout(conf: Any) -> float:
    """Seconds within which the layer's transport gives a dead consumer's jobs back."""
    return float(_options(conf).get("recovery_timeout") or DEFAULT_RECOVERY)


def longest_block(conf: Any) -> float:
    """The longest a consumer's fetch blocks in Redis: kombu's ``polling_interval`` (its
    block on one list), or its wait on one of several lists (``fetch_wait``, doubled
    while idle up to ``fetch_wait_max``)."""
    options = _options(conf)
    block = options.get("polling_interval") or min(
        DEFAULT_BLOCK, recovery_timeout(conf) / BLOCK_SHARE
    )
    waits = (
        block,
        options.get("fetch_wait") or 0.0,
        min(float(options.get("fetch_wait_max") or DEFAULT_FETCH_WAIT_MAX), float(block)),
    )
    return max(float(wait) for wait in waits)


def consumer_timeout(conf: Any) -> float:
    return float(conf.get("conventions_broker_consumer_timeout") or RABBITMQ_CONSUMER_TIMEOUT)


def config_findings(conf: Any) -> Iterator[Finding]:
    """The recovery bound on the layer's transport; the countdown bound on kombu's."""
    yield from doctor_sentinel.findings(conf)
    yield from doctor_cluster.config_findings(conf)
    yield from doctor_rabbitmq.config_findings(conf)
    yield from doctor_rabbitmq_cluster.config_findings(conf)
    explicit = conf.get("conventions_max_countdown")
    if layer_transport(conf):
        yield from recovery_findings(conf)
        if explicit:
            yield Finding(
                WARNING, "max-countdown-unneeded", "conventions_max_countdown",
                f"{float(explicit):.0f}s: the layer's Redis transport keeps delays in "
                "Redis and any length works, so this cap is not needed; remove it (it is "
                "for kombu's stock Redis transport and other brokers, where a worker holds "
                "a delayed message)",
            )  # fmt: skip
    elif explicit and broker_kind(conf) == "redis" and float(explicit) >= visibility_timeout(conf):
        yield Finding(
            ERROR, "countdown-beyond-visibility", "conventions_max_countdown",
            f"{float(explicit):.0f}s is not below the visibility timeout "
            f"({visibility_timeout(conf):.0f}s): kombu's stock Redis transport delivers a "
            f"longer-waiting ETA message twice; lower it, or select {STOCK_FIX}",
        )  # fmt: skip


#: the fix for kombu's stock Redis transport's limits on time
STOCK_FIX = (
    f"the layer's transport (broker_transport = {profile.INBOX_TRANSPORT!r}), which keeps "
    "delays in Redis and recovers by liveness"
)


def recovery_findings(conf: Any) -> Iterator[Finding]:
    """``recovery_timeout`` at most :data:`MAX_RECOVERY`, and long enough that a live
    consumer's renewal (every third of it) cannot lapse while its fetch blocks."""
    bound, block = recovery_timeout(conf), longest_block(conf)
    subject = "broker_transport_options['recovery_timeout']"
    if bound > MAX_RECOVERY:
        yield Finding(
            ERROR, "recovery-timeout-too-long", subject,
            f"{bound:g}s: a dead worker's jobs (in flight and in its inbox) would wait up to "
            f"{bound * BOUND_FACTOR:.0f}s (above {MAX_BOUND:g}) before they run again; set it "
            f"to {MAX_RECOVERY:g} or less (default "
            f"{DEFAULT_RECOVERY:g}); a long job on a live worker is never given back, "
            "whatever its time limit",
        )  # fmt: skip
    elif bound - bound / RENEWALS <= block:
        yield Finding(
            ERROR, "recovery-timeout-too-short", subject,
            f"{bound:g}s: a consumer renews its sign of life every {bound / RENEWALS:g}s "
            f"and a fetch may block {block:g}s (polling_interval, fetch_wait_max) before the "
            "renewal: a live worker would be taken for dead and its running jobs run "
            f"twice; raise it (default {DEFAULT_RECOVERY:g}) or lower polling_interval",
        )  # fmt: skip
    elif bound < MIN_RECOVERY:
        yield Finding(
            WARNING, "recovery-timeout-too-short", subject,
            f"{bound:g}s: a pause of the worker (a fork, a long GC) or of Redis (an fsync "
            f"stall, a failover) longer than {bound - bound / RENEWALS:g}s would make a "
            "live worker's jobs run twice; keep it at 10 s or more (default "
            f"{DEFAULT_RECOVERY:g}) outside tests",
        )  # fmt: skip


def task_findings(conf: Any, name: str, limit: float, cap: float) -> Iterator[Finding]:
    kind, delivered_twice = broker_kind(conf), False
    if layer_transport(conf):
        # any delay, any time limit: a live worker's job is never given back, unless its
        # renewal is off (tests: the visibility timeout is the recovery clock again)
        if _options(conf).get("renew_unacked") is False:
            yield from _stock_redis_checks(conf, name, limit, 0.0)
    elif kind == "redis":
        yield from _stock_redis_checks(conf, name, limit, cap)
        delivered_twice = cap >= visibility_timeout(conf)  # reported above, not clamped
    elif kind == "amqp":
        yield from amqp_findings(conf, name, limit, cap)
    max_countdown = settingslib.max_countdown(conf)
    if max_countdown < cap and not delivered_twice:
        yield Finding(
            WARNING, "retry-cap-clamped", name,
            f"Backoff(cap={cap:.0f}) is above the broker's safe countdown "
            f"({max_countdown:.0f}s): longer delays are shortened to it; lower the cap",
        )  # fmt: skip


def _stock_redis_checks(conf: Any, name: str, limit: float, cap: float) -> Iterator[Finding]:
    """kombu's stock Redis transport: a message unacked longer than the visibility
    timeout is delivered again, running or waiting for its ETA."""
    visibility = visibility_timeout(conf)
    if limit > visibility:
        yield Finding(
            ERROR, "time-limit-beyond-visibility", name,
            f"time limit {limit:.0f}s is beyond the visibility timeout ({visibility:.0f}s): "
            "a Redis transport that does not renew it (kombu's stock one, or "
            "renew_unacked = False) redelivers the running job to another worker; "
            "raise broker_transport_options['visibility_timeout'] above the longest time "
            f"limit plus the longest retry delay, lower the time limit, or select {STOCK_FIX}",
        )  # fmt: skip
    if cap >= visibility:
        yield Finding(
            ERROR, "countdown-beyond-visibility", name,
            f"Backoff(cap={cap:.0f}) is not below the visibility timeout "
            f"({visibility:.0f}s): on kombu's stock Redis transport a retry waiting that "
            f"long is delivered twice; lower the cap below "
            f"{settingslib.max_countdown(conf):.0f}s, raise "
            f"broker_transport_options['visibility_timeout'], or select {STOCK_FIX}",
        )  # fmt: skip


#: how to raise RabbitMQ's ``consumer_timeout`` (milliseconds on the broker)
CONSUMER_TIMEOUT_FIX = (
    "raise it on the broker (rabbitmq.conf: consumer_timeout = <milliseconds>; or per "
    "queue, RabbitMQ 3.12+: the x-consumer-timeout queue argument or a consumer-timeout "
    "policy) and set conventions_broker_consumer_timeout to it (seconds)"
)


def amqp_findings(conf: Any, name: str, limit: float, cap: float) -> Iterator[Finding]:
    """RabbitMQ closes a channel whose delivery stays unacked past ``consumer_timeout``
    (30 min by default) and delivers its messages again. A worker holds a job unacked
    while it runs (late acks) and, on classic queues, holds a retry's ETA message
    unacked until it is due (on quorum queues on topic exchanges RabbitMQ keeps it:
    Celery's native delayed delivery): a running job beyond the timeout is an error; a
    retry wait plus a run that reach it together, a warning."""
    held = 0.0 if settingslib.native_delays(conf) else min(cap, settingslib.max_countdown(conf))
    timeout = consumer_timeout(conf)
    if limit > timeout:
        yield Finding(
            ERROR, "time-limit-beyond-consumer-timeout", name,
            f"time limit {limit:.0f}s is beyond RabbitMQ's consumer_timeout "
            f"({timeout:.0f}s): the broker closes the channel and redelivers; "
            f"{CONSUMER_TIMEOUT_FIX}",
        )  # fmt: skip
    elif limit + held >= timeout:
        yield Finding(
            WARNING, "rabbitmq-consumer-timeout", name,
            f"time limit {limit:.0f}s plus the longest retry countdown {held:.0f}s (a "
            "worker holds an ETA message unacked until it is due) reaches RabbitMQ's "
            f"consumer_timeout ({timeout:.0f}s): the broker would close the channel and "
            f"deliver the job again; {CONSUMER_TIMEOUT_FIX}, or lower the cap or the limit",
        )  # fmt: skip
