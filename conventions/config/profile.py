"""The reliable profile: every Celery setting the layer's promises rest on, in one call.

::

    app.conf.update(reliable(broker_url=REDIS_URL, store_url=REDIS_URL))

:func:`reliable` answers a plain mapping. Its settings are of two kinds:

* **promises** (:func:`promises`): late acks, reject on worker lost, prefetch 1, JSON
  only, the layer's Redis transport, result writes retried, the dead-lettering consumer,
  no queue created by a typo, a publish bounded in time; on RabbitMQ, quorum queues
  (delivery limit, dead-lettering to the layer's poison queue, delays kept by the
  broker) and publisher confirms (``docs/howto/rabbitmq.md``). Jobs are safe only while
  these hold, so an override that breaks one is refused (``allow=`` takes the risk on
  purpose, by name);
* **defaults**: events, soft shutdown, time limits, result expiry, timeouts. Override
  them freely, by their Celery names.

An override that is not a setting of the profile is refused too (a typo would otherwise
be a setting nobody reads); app-specific settings (the workloads and their queues and
routes, schedules, the layer's own ``conventions_*``) go on ``app.conf`` beside the
profile (``task_create_missing_queues = False`` is a promise: declare ``task_queues``).
The doctor (:mod:`conventions.ops.doctor`) checks a running configuration against the
same :func:`promises`, and reports each deviation with the key, the value found and the
profile's. Every setting is explained in ``docs/reference/settings.md``.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from conventions.config import sentinel
from conventions.errors import ConfigurationError

#: seconds a publish waits on the broker, the result backend or the store before
#: ``.delay()`` raises ``BackendUnavailable``: the bound of each connect and each reply. A
#: server that refuses connections fails a publish at once; one that accepts them and never
#: answers after this (twice this when the result backend is that server too: Celery's
#: result subscription tries to reconnect once)
PUBLISH_TIMEOUT = 5.0
#: kombu's Redis visibility timeout when none is given (seconds): the recovery clock of
#: kombu's own Redis transport only
VISIBILITY_TIMEOUT = 3600.0
#: seconds after which a dead consumer's jobs are given back by the layer's transport
#: (a live one renews them: a job may run for hours); at most 36 (a bound of 60)
RECOVERY_TIMEOUT = 30.0
#: the layer's Redis transport: a fetch that cannot lose a message
#: (:mod:`conventions.transport.redis`, named here: ``config`` sits below ``transport``)
INBOX_TRANSPORT = "conventions.transport.redis:Transport"
#: the dead-lettering consumer: a message nobody can run is kept, never only logged
CONSUMER = "conventions.worker.consumer:Consumer"
#: the result backend class a ``redis://`` result URL goes through
RESULT_BACKEND = "conventions.results.redis:RedisBackend"
#: ... and a ``sentinel://`` one (Celery's Sentinel backend, the layer's writes riding)
SENTINEL_RESULT_BACKEND = "conventions.results.redis:SentinelBackend"
REDIS_SCHEMES = ("redis", "rediss")
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
JSON = ["json"]


@dataclass(frozen=True)
class Promise:
    """One setting a reliability promise rests on: the profile's value, the doctor's
    code and level for a deviation, and why it matters (the fix's reason)."""

    key: str
    value: Any
    code: str
    why: str
    level: str = "warning"
    #: a key inside the setting's mapping (``broker_transport_options['socket_timeout']``)
    option: str | None = None
    #: whether a found value keeps the promise (default: equal to ``value``)
    accepts: Callable[[Any], bool] | None = None

    @property
    def name(self) -> str:
        return f"{self.key}[{self.option!r}]" if self.option else self.key

    def found(self, conf: Any) -> Any:
        value = conf.get(self.key)
        if self.option is None:
            return value
        return value.get(self.option) if isinstance(value, Mapping) else None

    def kept_by(self, found: Any) -> bool:
        if self.accepts is not None:
            return self.accepts(found)
        if isinstance(self.value, list):
            return isinstance(found, list | tuple) and list(found) == self.value
        return bool(found == self.value)


def is_redis(url: Any) -> bool:
    """A Redis URL: ``redis://``, ``rediss://``, or a Sentinel group's (``sentinel://``)."""
    return isinstance(url, str) and (
        urlsplit(url).scheme in REDIS_SCHEMES or sentinel.is_sentinel(url)
    )


def is_amqp(url: Any) -> bool:
    """RabbitMQ through py-amqp (``amqp://``, ``amqps://``, ``pyamqp://``)."""
    return isinstance(url, str) and urlsplit(url.split(";")[0]).scheme in AMQP_SCHEMES


def broker_kind(url: Any) -> str:
    """``redis`` (Redis, Sentinel, a Unix socket), ``amqp`` (RabbitMQ through py-amqp),
    or the URL's scheme (``filesystem``, ``memory``; ``unknown`` when there is none): the
    one test of a broker's kind, for the doctor, the views and the profile."""
    if is_redis(url) or (isinstance(url, str) and urlsplit(url).scheme == "redis+socket"):
        return "redis"
    if is_amqp(url):
        return "amqp"
    return (urlsplit(url).scheme if isinstance(url, str) else "") or "unknown"


def names_layer_transport(found: Any) -> bool:
    """``broker_transport`` is the layer's Redis transport: "module:Class" or
    "module.Class", the class, or a subclass of it (by name: config never imports the
    transport)."""
    if isinstance(found, str):
        return found in (INBOX_TRANSPORT, INBOX_TRANSPORT.replace(":", "."))
    return isinstance(found, type) and any(
        f"{cls.__module__}:{cls.__qualname__}" == INBOX_TRANSPORT for cls in found.__mro__
    )


def publish_timeout(conf: Any) -> float:
    """The publish bound of ``conf`` (``conventions_publish_timeout``), in seconds."""
    return float(conf.get("conventions_publish_timeout") or PUBLISH_TIMEOUT)


def _bounded(found: Any) -> bool:
    return isinstance(found, int | float) and not isinstance(found, bool) and found > 0


def _retries_bounded(found: Any) -> bool:
    return isinstance(found, Mapping) and found.get("max_retries") is not None


def _inbox_transport(found: Any) -> bool:
    return found == INBOX_TRANSPORT or getattr(found, "Channel", None) is not None


def promises(conf: Any) -> list[Promise]:
    """The promises that apply to ``conf`` (a mapping or ``app.conf``): the Redis ones
    only on a Redis broker, the result ones only with a Redis result backend."""
    timeout = publish_timeout(conf)
    found = [
        Promise("task_acks_late", True, "profile-deviation",
                "a job is acked after its body, so a worker that dies mid-job leaves it to "
                "be delivered again"),
        Promise("task_reject_on_worker_lost", True, "profile-deviation",
                "a job whose pool process dies is put back instead of acked as failed"),
        Promise("worker_prefetch_multiplier", 1, "profile-deviation",
                "a process reserves one message at a time: no job waits, unacked, behind "
                "a long one until another worker gets it again"),
        Promise("worker_consumer", CONSUMER, "profile-deviation",
                "a message nobody can run is kept as a dead letter, not only logged"),
        Promise("task_create_missing_queues", False, "missing-queues-created",
                "a typo in a queue name would create a queue nobody consumes"),
        Promise("task_publish_retry_policy", _retry(1), "publish-unbounded",
                "a publish to a broker that is down is retried a bounded number of times, "
                "then raises BackendUnavailable", accepts=_retries_bounded),
    ]  # fmt: skip
    for key in ("task_serializer", "result_serializer"):
        found.append(Promise(key, "json", "profile-deviation", "JSON only, never pickle"))
    for key in ("accept_content", "result_accept_content"):
        found.append(Promise(key, JSON, "profile-deviation", "JSON only, never pickle"))
    if is_redis(conf.get("broker_url")):
        found += _redis_broker_promises(conf, timeout)
    if is_amqp(conf.get("broker_url")):
        found += _amqp_broker_promises()
    if conf.get("result_backend"):
        found.append(Promise(
            "result_backend_always_retry", True, "result-write-not-retried",
            "a result write (STARTED, or the final state) that fails on a lost connection "
            "would fail the job outside its body, and Celery acks it",
        ))  # fmt: skip
    if is_redis(_result_url(conf.get("result_backend"))):
        found += [
            Promise("redis_socket_timeout", timeout, "publish-unbounded",
                    "a result backend that does not answer holds a publish (which "
                    "subscribes to its result) this long at most", accepts=_bounded),
            Promise("result_backend_transport_options", {"retry_policy": _retry(0)},
                    "publish-unbounded",
                    "the result subscription of a publish gives up after one reconnection "
                    "(Celery's default: 20 more, about 19 s)",
                    accepts=lambda o: isinstance(o, Mapping)
                    and _retries_bounded(o.get("retry_policy"))),
        ]  # fmt: skip
    return found


def _redis_broker_promises(conf: Any, timeout: float) -> list[Promise]:
    return [
        Promise("broker_transport", INBOX_TRANSPORT, "redis-fetch-unsafe",
                "kombu's Redis fetch (BRPOP, then a second command) loses the message a "
                "worker is fetching when it is killed", accepts=_inbox_transport),
        Promise("worker_cancel_long_running_tasks_on_connection_loss", False,
                "cancel-on-connection-loss",
                "on Redis, a late-ack job cancelled when the connection drops is then acked: "
                "its message is lost (the ledger makes a second run harmless)"),
        Promise("broker_transport_options", timeout, "publish-unbounded",
                "a publish to a broker that accepts connections and never answers waits "
                "this long, not forever (kombu's default)", option="socket_timeout",
                accepts=_bounded),
        Promise("broker_transport_options", timeout, "publish-unbounded",
                "a connect to a broker that does not answer waits this long, not forever",
                option="socket_connect_timeout", accepts=_bounded),
    ]  # fmt: skip


def _amqp_broker_promises() -> list[Promise]:
    return [
        Promise("broker_transport_options", True, "publish-unconfirmed",
                "a publish returns once RabbitMQ has the message (publisher confirms): "
                "without them a message lost on the way, or routed nowhere, is never "
                "known to the caller", option="confirm_publish"),
        Promise("worker_detect_quorum_queues", True, "quorum-global-qos",
                "Celery turns global QoS off on quorum queues (which do not support it) "
                "and sets up native delayed delivery only when it detects them"),
    ]  # fmt: skip


def _retry(max_retries: int) -> dict[str, float]:
    return {"max_retries": max_retries, "interval_start": 0, "interval_step": 0.2,
            "interval_max": 0.2}  # fmt: skip


def _result_url(backend: Any) -> Any:
    """The URL of a ``module:Class+url`` result backend setting."""
    if isinstance(backend, str) and "+" in backend.split("://", 1)[0]:
        return backend.split("+", 1)[1]
    return backend


def reliable(
    *,
    broker_url: str,
    store_url: str,
    result_backend: str | None = None,
    publish_timeout: float = PUBLISH_TIMEOUT,
    recovery_timeout: float = RECOVERY_TIMEOUT,
    visibility_timeout: float | None = None,
    allow: Iterable[str] = (),
    **overrides: Any,
) -> dict[str, Any]:
    """The whole reliable profile for ``app.conf.update(...)``.

    ``result_backend``: a URL (a ``redis://`` one goes through the layer's backend);
    unset, the broker's URL when it is Redis, else no result backend.
    ``publish_timeout``: seconds before a ``.delay()`` whose broker or store does not
    answer raises ``BackendUnavailable``.
    ``recovery_timeout``: seconds (at most 36) after which a worker that died whole has
    its jobs given back; a live worker renews them, whatever they take. Its messages not
    yet due wait in Redis (any countdown works). ``visibility_timeout``: only for a
    transport that does not renew (``broker_transport_options['renew_unacked']=False``,
    or kombu's own): Redis redelivers an unacked message after it, so keep it above the
    longest time limit plus the longest retry delay. ``overrides``: any setting of
    the profile by its name (a ``broker_transport_options`` mapping is merged into the
    profile's); a setting that breaks a promise, or that the profile does not have, is
    a ``ConfigurationError`` unless its name is in ``allow``. A ``sentinel://`` broker
    (``sentinel://h:p;sentinel://h:p``) needs ``broker_transport_options={'master_name':
    ...}``: the layer's transport follows the group's primary, and so does the result
    backend when it is that group. An ``amqp://``
    broker gets quorum queues (``conventions_quorum_queues``) and publisher confirms.
    """
    allowed = set(allow)
    options = overrides.get("broker_transport_options") or {}
    if sentinel.is_sentinel(broker_url) and not options.get("master_name"):
        raise ConfigurationError(
            "reliable(): a sentinel:// broker needs broker_transport_options="
            "{'master_name': ...}: the name of the group whose primary it follows"
        )
    conf = _base(broker_url, store_url, result_backend, float(publish_timeout),
                 recovery=float(recovery_timeout), visibility=visibility_timeout)  # fmt: skip
    for key, value in overrides.items():
        if key not in conf and key not in allowed:
            raise ConfigurationError(_unknown(key, conf))
        merged = key == "broker_transport_options" and isinstance(value, Mapping)
        conf[key] = {**conf.get(key, {}), **value} if merged else value
    for promise in promises(conf):
        found = promise.found(conf)
        if promise.key not in allowed and not promise.kept_by(found):
            raise ConfigurationError(
                f"reliable(): {promise.name}={found!r} breaks a promise ({promise.why}); "
                f"keep {promise.value!r}, or pass allow={{{promise.key!r}}} to take the risk"
            )
    if sentinel.is_sentinel(_result_url(conf.get("result_backend"))):
        # Celery's Sentinel result backend finds the group by its transport options
        conf["result_backend_transport_options"] = {
            **conf.get("result_backend_transport_options", {}),
            "master_name": conf["broker_transport_options"].get("master_name"),
        }
    _check_time_limits(conf, allowed)
    return conf


def _base(
    broker_url: str, store_url: str, result_backend: str | None, timeout: float, *,
    recovery: float, visibility: float | None,
) -> dict[str, Any]:  # fmt: skip
    conf: dict[str, Any] = {
        "broker_url": broker_url,
        "conventions_store_url": store_url,
        "conventions_publish_timeout": timeout,
        # -- a bounded publish: one retry (a stale pooled connection), then the error
        "task_publish_retry": True,
        "broker_connection_timeout": timeout,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {},
        # -- defaults
        "task_track_started": True,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "worker_soft_shutdown_timeout": 10.0,
        # an idle worker's cold shutdown waits the soft timeout only where it may hold a
        # message not yet due (kombu's stock transports): the layer's Redis transport keeps
        # them in Redis, and RabbitMQ puts a held one back when the connection closes
        "worker_enable_soft_shutdown_on_idle": not (is_redis(broker_url) or is_amqp(broker_url)),
        "task_time_limit": 300,
        "task_soft_time_limit": 270,
        "result_expires": 86400,
        "result_extended": True,
        "enable_utc": True,
        "timezone": "UTC",
    }
    if is_redis(broker_url):
        conf["broker_transport_options"] = {
            # a dead worker's in-flight and fetched messages go back after this; a live
            # worker renews them (the layer's transport sets its visibility timeout to it)
            "recovery_timeout": recovery,
            # the sweep's mutex, left by a worker killed mid-sweep, lapses within a beat
            "unacked_mutex_expire": max(1, int(recovery / 3)),
            "unacked_restore_interval": max(1, int(recovery / 3)),
            # one list per queue: a worker reading one queue blocks on it
            "priority_steps": [0],
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
        }
        if visibility is not None:  # the recovery clock of a transport that does not renew
            conf["broker_transport_options"]["visibility_timeout"] = float(visibility)
    if is_amqp(broker_url):
        # publisher confirms: a publish waits for RabbitMQ's ack (the app adds mandatory)
        conf["broker_transport_options"] = {"confirm_publish": True}
        # the workload queues are quorum queues (the App builds them): a delivery limit,
        # dead letters to the layer's poison queue, delays kept by RabbitMQ. A default,
        # not a promise: False keeps classic queues while migrating (the doctor's
        # ``classic-queue`` says so for each)
        conf["conventions_quorum_queues"] = True
    results = result_backend or (broker_url if is_redis(broker_url) else None)
    if results:
        backend = SENTINEL_RESULT_BACKEND if sentinel.is_sentinel(results) else RESULT_BACKEND
        conf["result_backend"] = f"{backend}+{results}" if is_redis(results) else results
    if is_redis(results):
        conf["redis_socket_connect_timeout"] = timeout
    # every promise's own value: promises() is the one list, which the doctor reads too
    # (the broker's socket timeouts, kept inside its options, are set above)
    for promise in promises(conf):
        if promise.option is None:
            conf.setdefault(promise.key, copy.deepcopy(promise.value))
    return conf


def _unknown(key: str, conf: Mapping[str, Any]) -> str:
    near = difflib.get_close_matches(key, list(conf), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return (
        f"reliable(): {key!r} is not a setting of the profile; {hint}set app-specific "
        f"settings on app.conf beside the profile, or pass allow={{{key!r}}}"
    )


def renews(conf: Mapping[str, Any]) -> bool:
    """Whether the broker's transport renews a running job's message (the layer's Redis
    transport, unless ``renew_unacked`` is off): no visibility timeout to outlast."""
    options = conf.get("broker_transport_options") or {}
    return _inbox_transport(conf.get("broker_transport")) and bool(
        options.get("renew_unacked", True)
    )


def _check_time_limits(conf: Mapping[str, Any], allowed: set[str]) -> None:
    """The hard limit above the soft one, and below the visibility timeout on a Redis
    transport that does not renew a running job's message (else Redis delivers it
    again); ``allow={"visibility_timeout"}`` lets a test shorten the timeout on purpose."""
    hard, soft = conf.get("task_time_limit"), conf.get("task_soft_time_limit")
    if hard and soft and float(soft) >= float(hard):
        raise ConfigurationError(
            f"reliable(): task_soft_time_limit={soft!r} is not below task_time_limit="
            f"{hard!r}: the soft limit must come first, so the job can stop cleanly"
        )
    options = conf.get("broker_transport_options") or {}
    visibility = None if renews(conf) else options.get("visibility_timeout")
    beyond = bool(hard and visibility and float(hard) > float(visibility))
    if beyond and "visibility_timeout" not in allowed:
        raise ConfigurationError(
            f"reliable(): task_time_limit={hard!r} is beyond the visibility timeout "
            f"({visibility!r}): Redis would deliver a running job again; raise "
            "visibility_timeout, or pass allow={'visibility_timeout'}"
        )
