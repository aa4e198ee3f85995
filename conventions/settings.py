"""The layer's own settings, read from the Celery app's configuration with defaults.

``celeryconfig.py`` is the only place that reads the environment; this module only reads
``app.conf``. Every setting is listed in ``docs/reference/settings.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from conventions import backpressure, limits
from conventions.backpressure import Bound
from conventions.limits import Limit
from conventions.retention import AUDIT_RETENTION, DEAD_LETTER_RETENTION, RETENTION_INTERVAL
from conventions.store.redis_records import AUDIT_MAX_EVENTS, AUDIT_MAX_TRAILS

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
    #: named dependency limits (``conventions_limits``), shared by every worker
    limits: dict[str, Limit] = field(default_factory=dict)
    #: per-queue bounds on depth or oldest age (``conventions_backpressure``); off if empty
    backpressure: dict[str, Bound] = field(default_factory=dict)


def _broker_url(conf: Any) -> str:
    url = conf.get("broker_url") or ""
    return url if isinstance(url, str) else ""


def max_countdown(conf: Any) -> float:
    """The longest safe countdown: below the Redis visibility timeout, with a margin.

    Redis redelivers a message that stays unacked longer than the visibility timeout,
    and a worker keeps an ETA message unacked until it is due (celery/kombu#337).
    """
    explicit = conf.get("conventions_max_countdown")
    if explicit:
        return float(explicit)
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
        limits=limits.parse(conf.get("conventions_limits")),
        backpressure=backpressure.parse(conf.get("conventions_backpressure")),
    )


def store_options(conf: Settings) -> dict[str, Any]:
    """What a Redis store takes from the settings: the audit trail's lifetime and caps."""
    return {
        "audit_ttl": conf.audit_retention,
        "audit_max_trails": conf.audit_max_trails,
        "audit_max_events": conf.audit_max_events,
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
