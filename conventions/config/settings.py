"""The layer's own settings, read from the Celery app's configuration with defaults.

``celeryconfig.py`` is the only place that reads the environment; this module only reads
``app.conf``. Every setting is listed in ``docs/reference/settings.md``.

It also masks what is shown of the settings. Celery hides the values of the settings it
knows (``broker_url``, names holding ``backend``, ``PASS``, ``SECRET``, ``DATABASE``...)
when it prints them (``celery report``, ``celery inspect conf``, Flower's config tab),
but not ``conventions_store_url``, a project's ``REDIS_URL`` or ``*_smtp_url``:
:class:`MaskedSettings` masks the password of every URL in any setting, whatever its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery.app.utils import Settings as CelerySettings
from celery.app.utils import sanitize_url

from conventions.config import profile
from conventions.config.capacity import Bound, Limit, parse_bounds, parse_limits

#: the most trails (correlation ids) kept; beyond it the ones idle longest are dropped
AUDIT_MAX_TRAILS = 1_000_000
#: the most events one trail keeps (its newest): a fan-out or a retry storm stays bounded
AUDIT_MAX_EVENTS = 500
#: dead letters are kept this long after their last failure
DEAD_LETTER_RETENTION = timedelta(days=30)
#: audit trails are kept this long after their last event
AUDIT_RETENTION = timedelta(days=14)
#: runs (run history) are kept this long after they were created
RUNS_RETENTION = timedelta(days=7)
#: the most runs a Redis store keeps; beyond it the oldest are dropped
RUNS_MAX = 100_000
#: the most log lines one run keeps (its newest), for the jobs that keep theirs
RUNS_MAX_LOGS = 100
#: how often a worker purges (``conventions.ops.retention``)
RETENTION_INTERVAL = timedelta(hours=6)

#: seconds a ledger lease lasts before another execution may take the key over
DEFAULT_LEASE = 30.0
#: a job claimed this many times for one attempt without finishing is a poison pill
DEFAULT_MAX_DELIVERIES = 3
#: how long a succeeded key is remembered by the ledger (seconds)
DEFAULT_LEDGER_KEEP = 7 * 86400.0
#: hard time limit of a task that declares none (seconds)
DEFAULT_TIME_LIMIT = 300.0
#: Redis visibility timeout Celery uses when none is configured (seconds)
CELERY_REDIS_VISIBILITY = 3600.0
#: margin kept between the longest countdown and the visibility timeout (seconds)
COUNTDOWN_MARGIN = 60.0
#: longest countdown on brokers without a visibility timeout (RabbitMQ's consumer timeout
#: is 30 minutes by default, and a worker holds an ETA message unacked until it is due)
DEFAULT_MAX_COUNTDOWN = 900.0
#: longest countdown through the layer's Redis transport, whose messages not yet due wait
#: in a delayed set inside Redis, never in a worker (seconds: a year)
DELAYED_SET_MAX_COUNTDOWN = 366 * 86400.0
#: the quorum queues' delivery limit above the layer's own poison detection: the layer
#: quarantines a job at its ``max_deliveries + 1``-th claim; the broker's limit, this
#: many deliveries later, catches what never reaches a claim (a worker that dies decoding)
DELIVERY_LIMIT_MARGIN = 2
#: the layer-owned exchange and quorum queue every workload queue dead-letters to on
#: RabbitMQ (``conventions_poison_queue``): read by the poison-queue consumer
POISON_QUEUE = "conventions.poison"
#: what replaces a password where settings are shown (Celery's own mask)
MASK = "********"
#: a query parameter or ``key=value`` pair that carries a secret (``?password=``,
#: ``auth_token=``, libpq's ``password=``)
SECRET_PAIR = re.compile(
    r"(?i)(?<![\w-])((?:[\w-]*_)?(?:password|passwd|pass|pwd|secret|token|api_?key|access_?key)"
    r"\s*=\s*)[^&;#\s]+"
)


@dataclass(frozen=True)
class Settings:
    """The layer's settings for one app."""

    store_url: str | None
    lease: float
    max_deliveries: int
    ledger_keep: float
    default_time_limit: float
    workload_time_limits: dict[str, float]
    max_countdown: float
    #: do workers purge dead letters and audit trails on their own?
    retention_enabled: bool
    #: seconds a dead letter is kept after its last failure
    dead_letter_retention: float
    #: seconds an audit trail is kept after its last event
    audit_retention: float
    #: seconds between two purges of a worker
    retention_interval: float
    #: the most audit trails (correlation ids) a Redis store keeps; 0: no cap
    audit_max_trails: int = AUDIT_MAX_TRAILS
    #: the most events one audit trail keeps (its newest) on Redis; 0: no cap
    audit_max_events: int = AUDIT_MAX_EVENTS
    #: record run history (``conventions.store.runs``)?
    runs_enabled: bool = True
    #: seconds a run is kept after it was created
    runs_retention: float = RUNS_RETENTION.total_seconds()
    #: the most runs a Redis store keeps (the oldest go first); 0: no cap
    runs_max: int = RUNS_MAX
    #: the most log lines one run keeps (its newest); 0: none
    runs_max_logs: int = RUNS_MAX_LOGS
    #: seconds a publish (and each store call) may wait for the broker or the store
    publish_timeout: float = profile.PUBLISH_TIMEOUT
    #: named dependency limits (``conventions_limits``), shared by every worker
    limits: dict[str, Limit] = field(default_factory=dict)
    #: per-queue bounds on depth or oldest age (``conventions_backpressure``); off if empty
    backpressure: dict[str, Bound] = field(default_factory=dict)


def _broker_url(conf: Any) -> str:
    url = conf.get("broker_url") or ""
    return url if isinstance(url, str) else ""


def is_amqp(conf: Any) -> bool:
    """Whether the broker is RabbitMQ (``amqp://``, ``amqps://``, ``pyamqp://``)."""
    return profile.is_amqp(conf.get("broker_url"))


def quorum_queues(conf: Any) -> bool:
    """Whether the app's workload queues are RabbitMQ quorum queues: its declared
    ``task_queues`` when set (every one quorum), else ``conventions_quorum_queues``
    (which the reliable profile sets on amqp, and from which ``App`` builds them)."""
    if not is_amqp(conf):
        return False
    declared = conf.get("task_queues")
    if declared:
        return all(
            (getattr(queue, "queue_arguments", None) or {}).get("x-queue-type") == "quorum"
            for queue in declared
        )
    return bool(conf.get("conventions_quorum_queues"))


def native_delays(conf: Any) -> bool:
    """Whether RabbitMQ keeps the delays (Celery's native delayed delivery): quorum queues
    on exchanges that are not direct (Celery routes a countdown through the topic
    exchanges ``celery_delayed_*`` only then)."""
    if not quorum_queues(conf):
        return False
    declared = conf.get("task_queues")
    if declared:
        return all(
            getattr(getattr(queue, "exchange", None), "type", "direct") != "direct"
            for queue in declared
        )
    return True


def delivery_limit(conf: Any) -> int:
    """The quorum queues' ``x-delivery-limit``: ``conventions_delivery_limit``, else the
    layer's ``max_deliveries`` plus :data:`DELIVERY_LIMIT_MARGIN`."""
    explicit = conf.get("conventions_delivery_limit")
    if explicit:
        return int(explicit)
    claims = int(conf.get("conventions_max_deliveries") or DEFAULT_MAX_DELIVERIES)
    return claims + DELIVERY_LIMIT_MARGIN


def poison_queue(conf: Any) -> str:
    """The name of the layer's poison exchange and queue on RabbitMQ."""
    return str(conf.get("conventions_poison_queue") or POISON_QUEUE)


def delayed_delivery(conf: Any) -> bool:
    """Whether the broker keeps messages not yet due itself, so that no worker holds one
    and any countdown is safe: the layer's Redis transport (delayed sets), or RabbitMQ's
    quorum queues on topic exchanges (Celery's native delayed delivery,
    :func:`native_delays`)."""
    ours = profile.names_layer_transport(conf.get("broker_transport"))
    redis = ours and profile.is_redis(_broker_url(conf))  # Sentinel's channel keeps them too
    return redis or native_delays(conf)


def max_countdown(conf: Any) -> float:
    """The longest safe countdown: a year where the broker keeps the delays (the layer's
    Redis transport, RabbitMQ's native delayed delivery: 2**28 - 1 s at most); on kombu's
    own Redis transport, below the visibility timeout with a margin.

    kombu's Redis transport redelivers a message that stays unacked longer than the
    visibility timeout, and a worker keeps an ETA message unacked until it is due
    (celery/kombu#337). ``conventions_max_countdown`` overrides both.
    """
    explicit = conf.get("conventions_max_countdown")
    if explicit:
        return float(explicit)
    if delayed_delivery(conf):
        return DELAYED_SET_MAX_COUNTDOWN
    url = _broker_url(conf)
    if url.startswith(("redis", "rediss", "sentinel")):
        options = conf.get("broker_transport_options") or {}
        visibility = float(options.get("visibility_timeout", CELERY_REDIS_VISIBILITY))
        return max(visibility - COUNTDOWN_MARGIN, 1.0)
    return DEFAULT_MAX_COUNTDOWN


def read(conf: Any) -> Settings:
    """The settings of ``conf`` (a Celery ``app.conf``)."""
    return Settings(
        store_url=conf.get("conventions_store_url"),
        lease=float(conf.get("conventions_lease_seconds") or DEFAULT_LEASE),
        max_deliveries=int(conf.get("conventions_max_deliveries") or DEFAULT_MAX_DELIVERIES),
        ledger_keep=float(conf.get("conventions_ledger_keep_seconds") or DEFAULT_LEDGER_KEEP),
        default_time_limit=float(conf.get("conventions_default_time_limit") or DEFAULT_TIME_LIMIT),
        workload_time_limits=dict(conf.get("conventions_workload_time_limits") or {}),
        max_countdown=max_countdown(conf),
        retention_enabled=_enabled(conf.get("conventions_retention_enabled")),
        dead_letter_retention=_seconds(
            conf, "conventions_dead_letter_retention_seconds", DEAD_LETTER_RETENTION
        ),
        audit_retention=_seconds(conf, "conventions_audit_retention_seconds", AUDIT_RETENTION),
        retention_interval=_seconds(
            conf, "conventions_retention_interval_seconds", RETENTION_INTERVAL
        ),
        audit_max_trails=_count(conf, "conventions_audit_max_trails", AUDIT_MAX_TRAILS),
        audit_max_events=_count(conf, "conventions_audit_max_events", AUDIT_MAX_EVENTS),
        runs_enabled=_enabled(conf.get("conventions_runs_enabled")),
        runs_retention=_seconds(conf, "conventions_runs_retention_seconds", RUNS_RETENTION),
        runs_max=_count(conf, "conventions_runs_max", RUNS_MAX),
        runs_max_logs=_count(conf, "conventions_runs_max_logs", RUNS_MAX_LOGS),
        publish_timeout=profile.publish_timeout(conf),
        limits=parse_limits(conf.get("conventions_limits")),
        backpressure=parse_bounds(conf.get("conventions_backpressure")),
    )


def store_options(conf: Settings) -> dict[str, Any]:
    """What a Redis store takes from the settings: the audit trail's lifetime and caps,
    and the bound of every call (the profile's publish timeout)."""
    return {
        "audit_ttl": conf.audit_retention,
        "audit_max_trails": conf.audit_max_trails,
        "audit_max_events": conf.audit_max_events,
        "runs_enabled": conf.runs_enabled,
        "runs_max": conf.runs_max,
        "runs_max_logs": conf.runs_max_logs,
        "socket_timeout": conf.publish_timeout,
        "done_horizon": conf.ledger_keep,
    }


def _count(conf: Any, name: str, default: int) -> int:
    """A count of 0 or more (0: no cap); unset gives ``default``."""
    value = conf.get(name)
    if value is None or value == "":
        return default
    count = int(value)
    if count < 0:
        raise ValueError(f"{name} = {value!r}: give a count of 0 or more (0: no cap)")
    return count


def _enabled(value: Any) -> bool:
    return value is None or bool(value)


def _seconds(conf: Any, name: str, default: timedelta) -> float:
    """A positive number of seconds; unset, 0 or negative gives ``default``."""
    value = float(conf.get(name) or 0)
    return value if value > 0 else default.total_seconds()


def failover_urls(url: Any) -> list[str]:
    """Each URL of a broker failover list (``amqp://a;amqp://b``, or a list of URLs, as
    kombu takes them), in order; empty when none is set."""
    parts = url.split(";") if isinstance(url, str) else list(url or ())
    return [str(part).strip() for part in parts if str(part).strip()]


# -- what is shown of the settings -----------------------------------------------------


def mask_url(url: str) -> str:
    """``url`` with every password masked (each host of a failover list, and secret
    query parameters); the scheme, user, hosts and path are kept for diagnosis."""
    return SECRET_PAIR.sub(rf"\g<1>{MASK}", str(sanitize_url(url, mask=MASK)))


def masked(value: Any, key: str = "") -> Any:
    """``value`` as it may be shown: every URL or ``key=value`` secret in it masked, in
    mappings, lists and tuples too. A DSN's user part is its key (Sentry's), so under a
    name ending in ``dsn`` the whole user part is masked."""
    if isinstance(value, str):
        if "://" not in value:
            return SECRET_PAIR.sub(rf"\g<1>{MASK}", value)
        shown = mask_url(value)
        if key.lower().endswith("dsn"):
            shown = re.sub(r"://[^/@]+@", f"://{MASK}@", shown)
        return shown
    if isinstance(value, Mapping):
        return {name: masked(item, str(name)) for name, item in value.items()}
    if isinstance(value, list):
        return [masked(item, key) for item in value]
    if isinstance(value, tuple):
        return tuple(masked(item, key) for item in value)
    return value


class MaskedSettings(CelerySettings):  # type: ignore[misc]
    """Celery's settings whose shown table (``celery report``, ``inspect conf``) masks
    every URL-like value on top of Celery's own censoring; the values themselves are
    untouched (``app.conf.conventions_store_url`` keeps its password)."""

    def table(self, with_defaults: bool = False, censored: bool = True) -> dict[str, Any]:
        shown = super().table(with_defaults, censored)
        return {key: masked(value, str(key)) for key, value in shown.items()} if censored else shown
