"""``conventions doctor``: find the dangerous combinations before they lose a job.

Static checks read the app's configuration and its registered tasks (and ask the
broker's Redis for two server settings); they run at every worker start, where an
error refuses to start the worker and a warning is logged. Live checks
(``conventions.ops.doctor_live``) ask the running workers which queues they consume and
the broker how long each queue is.

Time depends on the broker and its transport (:mod:`conventions.ops.doctor_time`): on
the layer's Redis transport the recovery bound is checked, on kombu's stock one the
visibility timeout against time limits and countdowns.

The configuration is checked against the reliable profile's promises
(:func:`conventions.config.profile.promises`, the list ``reliable()`` sets): one source
of truth, each deviation reported with the key, the value found and the profile's.

Every finding has a stable ``code``; ``conventions_doctor_levels`` in the app's
configuration turns a code into ``"error"``, ``"warning"`` or ``"off"`` (a laptop's
Redis without persistence, say: an error by default, since a restart loses every queued
job). Each message says the fix.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from celery.exceptions import QueueNotFound

from conventions.config import profile, sentinel
from conventions.config import settings as settingslib
from conventions.jobs import routing
from conventions.ops import doctor_cluster, doctor_formats, doctor_rabbitmq_cluster, doctor_time
from conventions.ops.doctor_time import (
    broker_kind,
    consumer_timeout,
    layer_transport,
    visibility_timeout,
)
from conventions.ops.findings import ERROR, OFF, WARNING, Finding, apply_levels, errors
from conventions.store.redis_records import AUDIT_BYTES_PER_JOB
from conventions.tracing.scrubbing import scrub_text
from conventions.transport import skew

logger = logging.getLogger("conventions.ops.doctor")

#: what the doctor's callers use (the findings and the broker's kind live in
#: :mod:`conventions.ops.findings` and :mod:`conventions.ops.doctor_time`)
__all__ = [
    "ERROR", "OFF", "WARNING", "Finding", "apply_levels", "audit_findings", "broker_kind",
    "consumer_timeout", "errors", "format_text", "layer_transport", "profile_findings",
    "redis_servers", "static_checks", "user_tasks", "version_findings",
    "visibility_timeout",
]  # fmt: skip

#: what a serializer named pickle is called on the wire, too
PICKLE = {"pickle", "application/x-python-serialize"}
#: the share of the broker's memory the audit trail may take at its cap before the
#: doctor warns (the queues need the rest, and at OOM a ``noeviction`` Redis refuses writes)
AUDIT_MEMORY_SHARE = 0.25


def user_tasks(app: Any) -> list[Any]:
    """The app's tasks, Celery's own ``celery.*`` tasks left out."""
    return [t for name, t in sorted(app.tasks.items()) if not name.startswith("celery.")]


def static_checks(app: Any, *, server: bool = True, conf: Any = None) -> list[Finding]:
    """Every static finding, with the app's level overrides applied; ``server=False``
    skips asking the broker's Redis for its settings. ``conf`` is the configuration
    checked (default ``app.conf``): a command passes the app's own settings, not the
    bounded ones it runs with."""
    conf = app.conf if conf is None else conf
    findings = list(_config_checks(conf))
    for task in user_tasks(app):
        findings.extend(_task_checks(app, task, conf))
    if server:
        for url in redis_servers(conf):
            findings.extend(_redis_server_checks(url, conf))
        findings.extend(doctor_cluster.server_findings(conf))
        queues = {q.name for q in app.amqp.queues.values()} if settingslib.is_amqp(conf) else set()
        findings.extend(doctor_rabbitmq_cluster.server_findings(conf, queues))
        findings.extend(doctor_formats.format_findings(app, write=True))
    return apply_levels(findings, conf)


def _config_checks(conf: Any) -> Iterator[Finding]:
    accepted = set(conf.get("accept_content") or ()) | set(conf.get("result_accept_content") or ())
    serializers = {conf.get("task_serializer"), conf.get("result_serializer")}
    pickled = bool((accepted | serializers) & PICKLE)
    if pickled:
        yield Finding(
            ERROR, "pickle-accepted", "serializers",
            "pickle is accepted or used: anyone who can publish to the broker can run code "
            "in the worker; set task_serializer/result_serializer = 'json' and "
            "accept_content = result_accept_content = ['json']",
        )  # fmt: skip
    yield from doctor_time.config_findings(conf)
    # pickle is the error above: its serializer settings are not reported twice
    yield from profile_findings(conf, skip=SERIALIZER_KEYS if pickled else ())


#: the settings the ``pickle-accepted`` check reads
SERIALIZER_KEYS = ("task_serializer", "result_serializer", "accept_content",
                   "result_accept_content")  # fmt: skip


def profile_findings(conf: Any, skip: Iterable[str] = ()) -> Iterator[Finding]:
    """One finding per promise of the reliable profile (:func:`conventions.config.profile.
    promises`, the list ``reliable()`` sets) that ``conf`` does not keep: the key, the value
    found and the profile's."""
    skipped = set(skip)
    for promise in profile.promises(conf):
        found = promise.found(conf)
        if promise.key in skipped or promise.kept_by(found):
            continue
        yield Finding(
            promise.level, promise.code, promise.name,
            f"{found!r}, the profile's value is {promise.value!r}: {promise.why}; set "
            f"{promise.name} = {promise.value!r} (conventions.config.profile.reliable() does)",
        )  # fmt: skip


def _task_checks(app: Any, task: Any, conf: Any) -> Iterator[Finding]:
    name = task.name
    try:
        routing.routed_queue(app, task)
    except QueueNotFound as exc:
        yield Finding(
            ERROR, "route-undeclared-queue", name,
            f"routed to an undeclared queue ({exc}): declare it in task_queues (or map the "
            "task's workload to a declared queue in conventions_workloads)",
        )  # fmt: skip
    if getattr(task, "acks_late", False) and not getattr(task, "reject_on_worker_lost", False):
        yield Finding(
            ERROR, "acks-late-without-reject", name,
            "acks_late without reject_on_worker_lost: a job whose worker process dies is "
            "acked and lost; set task_reject_on_worker_lost = True",
        )  # fmt: skip
    limit = task.time_limit or conf.get("task_time_limit")
    if not limit:
        yield Finding(
            WARNING, "no-time-limit", name,
            "no hard time limit: a stuck job holds its worker process forever; set "
            "time_limit= on the task or task_time_limit",
        )  # fmt: skip
    yield from doctor_time.task_findings(conf, name, float(limit or 0), _retry_cap(task))


def _retry_cap(task: Any) -> float:
    backoff = getattr(task, "backoff", None)
    return float(getattr(backoff, "cap", 0) or 0) if backoff is not None else 0.0


def redis_servers(conf: Any) -> list[str]:
    """The URL of each Redis server the app keeps jobs in: the broker's, and the store's
    when it is another server (the same settings matter there: it holds the ledger)."""
    urls = [str(conf.get("broker_url"))] if broker_kind(conf) == "redis" else []
    store = str(conf.get("conventions_store_url") or "")
    redis_store = urlsplit(store).scheme in ("redis", "rediss") or sentinel.is_sentinel(store)
    if redis_store and _where(store) not in map(_where, urls):
        urls.append(store)
    return urls


#: the oldest Redis the layer runs on: ``SET NX GET`` and ``ZADD GT`` in the store,
#: ``BLMOVE`` in the transport
OLDEST_REDIS = (7, 0)


def version_findings(where: str, version: str) -> Iterator[Finding]:
    """An error when the server's ``redis_version`` is older than :data:`OLDEST_REDIS`."""
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return
    if version and found < OLDEST_REDIS:
        yield Finding(
            ERROR, "redis-too-old", where,
            f"Redis {version}: the layer needs 7.0 or newer (SET NX GET and ZADD GT in the "
            "store, BLMOVE in the transport); upgrade the server",
        )  # fmt: skip


def audit_findings(where: str, conf: Any, memory: int) -> Iterator[Finding]:
    """A warning when the store's audit trail shares the broker's Redis server
    (``memory`` bytes: its ``maxmemory``, else the machine's) and may grow, at its cap,
    beyond :data:`AUDIT_MEMORY_SHARE` of it; the estimate is the sizing rule of the
    settings reference (bytes per job x trails kept)."""
    store = str(conf.get("conventions_store_url") or "")
    if broker_kind(conf) != "redis" or urlsplit(store).scheme not in ("redis", "rediss"):
        return
    if not _where(store) == _where(str(conf.get("broker_url"))) == where or memory <= 0:
        return
    conventions = settingslib.read(conf)
    trails, days = conventions.audit_max_trails, conventions.audit_retention / 86400
    fix = (
        "lower conventions_audit_max_trails or conventions_audit_retention_seconds, or "
        "give the store a Redis of its own (conventions_store_url)"
    )
    if trails == 0:
        yield Finding(
            WARNING, "audit-fills-broker", where,
            f"the audit trail has no cap (conventions_audit_max_trails = 0) and shares the "
            f"broker's server: about {AUDIT_BYTES_PER_JOB} bytes per job for {days:.0f} days "
            f"(10 jobs/s: {AUDIT_BYTES_PER_JOB * 10 * 86400 * days / 1e9:.1f} GB); {fix}",
        )  # fmt: skip
        return
    bound = trails * AUDIT_BYTES_PER_JOB
    if bound > AUDIT_MEMORY_SHARE * memory:
        yield Finding(
            WARNING, "audit-fills-broker", where,
            f"the audit trail may take {bound / 1e6:.0f} MB ({trails} trails x about "
            f"{AUDIT_BYTES_PER_JOB} bytes) of this server's {memory / 1e6:.0f} MB, which the "
            f"queues share (at OOM, workers stop draining); {fix}",
        )  # fmt: skip


def _memory(client: Any) -> int:
    """The server's ``maxmemory``, else the machine's memory (0 when unknown)."""
    limit = int(client.config_get("maxmemory").get("maxmemory") or 0)
    return limit or int(client.info("memory").get("total_system_memory") or 0)


def _redis_server_checks(url: str, conf: Any) -> Iterator[Finding]:
    import redis

    try:
        options = conf.get("broker_transport_options") if url == conf.get("broker_url") else None
        client = sentinel.broker_client(url, options, socket_timeout=5, decode_responses=True)
        with client:
            with contextlib.suppress(redis.RedisError):  # INFO refused: the calls will say
                yield from version_findings(
                    _where(url), str(client.info("server")["redis_version"])
                )
            policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
            persistence = client.config_get("appendonly").get("appendonly") == "yes" or bool(
                client.config_get("save").get("save")
            )
            memory = _memory(client)
            found = skew.measure(client)
    except redis.RedisError as exc:
        yield Finding(
            WARNING, "redis-config-unreadable", _where(url),
            f"could not read the server's settings ({scrub_text(str(exc))}); make sure "
            "maxmemory-policy is noeviction and persistence (AOF) is on",
        )  # fmt: skip
        return
    if policy != "noeviction":
        yield Finding(
            ERROR, "redis-eviction", _where(url),
            f"maxmemory-policy is {policy!r}: a full Redis silently drops queued jobs and "
            "idempotency keys; set maxmemory-policy noeviction",
        )  # fmt: skip
    if not persistence:
        yield Finding(
            ERROR, "redis-no-persistence", _where(url),
            "neither AOF nor RDB snapshots are on: a Redis restart loses every queued job "
            "and every idempotency key; run redis-server --appendonly yes (a throwaway "
            "Redis: conventions_doctor_levels = {'redis-no-persistence': 'warning'})",
        )  # fmt: skip
    yield from audit_findings(_where(url), conf, memory)
    yield from skew_findings(_where(url), found)


def clock_checks(app: Any) -> list[Finding]:
    """The ``clock-skew`` check against each Redis server the app keeps jobs in, and the
    format checks (:mod:`conventions.ops.doctor_formats`): what beat runs at start, with
    the app's level overrides applied."""
    import redis

    findings: list[Finding] = []
    conf = app.conf
    for url in redis_servers(conf):
        options = conf.get("broker_transport_options") if url == conf.get("broker_url") else None
        try:
            client = sentinel.broker_client(url, options, socket_timeout=5)
            with client:
                found = skew.measure(client)
        except redis.RedisError:
            continue  # Redis not there yet: beat's own publishes will say so
        findings.extend(skew_findings(_where(url), found))
    findings.extend(doctor_formats.format_findings(app, write=True))
    return apply_levels(findings, conf)


def skew_findings(where: str, found: float | None) -> Iterator[Finding]:
    """This machine's clock against the Redis server's (:mod:`conventions.transport.
    skew`): a warning from ``WARN_AT`` seconds, an error from ``REFUSE_AT``."""
    if found is None or abs(found) < skew.WARN_AT:
        return
    level = ERROR if abs(found) >= skew.REFUSE_AT else WARNING
    yield Finding(
        level, "clock-skew", where,
        f"this machine's clock is {found:+.1f}s from the Redis server's (warning from "
        f"{skew.WARN_AT:.0f}s, error from {skew.REFUSE_AT:.0f}s): leases and due times "
        "follow Redis, but the countdowns this process writes, beat's firings, expiries "
        "and the run history's timestamps are off by that much; fix its time sync (NTP)",
    )  # fmt: skip


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"redis {parts.hostname}:{parts.port or 6379}"


def format_text(findings: list[Finding]) -> str:
    if not findings:
        return "ok: no findings"
    return "\n".join(f.line() for f in sorted(findings, key=lambda f: (f.level != ERROR, f.code)))
