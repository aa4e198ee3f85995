"""The kombu and Celery members the layer relies on beyond their public API still exist,
with the signatures it calls them with (and the members of
``opentelemetry-instrumentation-celery`` whose spans ``conventions.tracing.otel`` annotates).

``conventions.transport.redis`` subclasses kombu's Redis channel and overrides or calls private
members; ``conventions.results.redis`` overrides a private method of Celery's Redis backend.
A kombu or Celery release that renames one breaks every fetch (kombu 5.6 lacks
``_flush_brpop_reauth``: each fetch raised ``AttributeError``). A failure here names the
member; upgrading kombu or Celery past the pinned range starts with this file.
"""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from conventions.transport import checks as broker_checks

ROOT = Path(__file__).resolve().parents[2]
KOMBU_REDIS, KOMBU_VIRTUAL = "kombu.transport.redis", "kombu.transport.virtual"
CELERY_REDIS = "celery.backends.redis:RedisBackend"
DELAYS = "kombu.transport.native_delayed_delivery"
OTEL_CELERY = "opentelemetry.instrumentation.celery"
RETRIEVE_CONTEXT = (
    "(task: 'Task | None', task_id: 'str', is_publish: 'bool' = False) -> 'ContextTuple | None'"
)

#: (owner as "module:qualname", member) -> the signature relied on, or None for a value
METHODS: dict[tuple[str, str], str | None] = {
    (f"{KOMBU_REDIS}:Channel", "_brpop_start"): "(self, timeout=None)",
    (f"{KOMBU_REDIS}:Channel", "_brpop_read"): "(self, **options)",
    (f"{KOMBU_REDIS}:Channel", "_create_client"): "(self, asynchronous=False)",
    (f"{KOMBU_REDIS}:Channel", "_put"): "(self, queue, message, **kwargs)",
    (f"{KOMBU_REDIS}:Channel", "_q_for_pri"): "(self, queue, pri)",
    (f"{KOMBU_REDIS}:Channel", "_get_message_priority"): "(self, message, reverse=False)",
    (f"{KOMBU_REDIS}:Channel", "_flush_brpop_reauth"): "(self)",
    (f"{KOMBU_REDIS}:Channel", "conn_or_acquire"): "(self, client=None)",
    (f"{KOMBU_REDIS}:Channel", "close"): "(self)",
    (f"{KOMBU_REDIS}:Channel", "_in_poll"): None,
    (f"{KOMBU_REDIS}:Channel", "_brpop_sent_at"): None,
    (f"{KOMBU_REDIS}:Channel", "from_transport_options"): None,
    (f"{KOMBU_REDIS}:Channel", "unacked_key"): None,
    (f"{KOMBU_REDIS}:Channel", "unacked_index_key"): None,
    (f"{KOMBU_REDIS}:Channel", "priority_steps"): None,
    (f"{KOMBU_REDIS}:Channel", "sep"): None,
    (f"{KOMBU_REDIS}:Channel", "client"): None,
    (f"{KOMBU_REDIS}:Channel", "pool"): None,
    (f"{KOMBU_REDIS}:Channel", "active_queues"): None,
    # conventions.transport.redis: no-ack consumers and the envelope check
    # (conventions.transport.envelope)
    (f"{KOMBU_REDIS}:Channel", "basic_consume"): "(self, queue, *args, **kwargs)",
    (f"{KOMBU_REDIS}:Channel", "basic_cancel"): "(self, consumer_tag)",
    (f"{KOMBU_REDIS}:Channel", "decode_body"): "(self, body, encoding=None)",
    (f"{KOMBU_REDIS}:Channel", "codecs"): None,
    (f"{KOMBU_REDIS}:QoS", "append"): "(self, message, delivery_tag)",
    (f"{KOMBU_REDIS}:QoS", "restore_visible"): "(self, start=0, num=10, interval=10)",
    (f"{KOMBU_VIRTUAL}:QoS", "append"): "(self, message, delivery_tag)",
    # conventions.transport.redis: the restore on the Redis server's clock
    (f"{KOMBU_REDIS}:QoS", "restore_by_tag"): "(self, tag, client=None, leftmost=False)",
    # conventions.transport.redis: a restored message rings its queue's bell
    (f"{KOMBU_REDIS}:Channel", "_do_restore_message"): (
        "(self, payload, exchange, routing_key, pipe, leftmost=False)"
    ),
    (f"{KOMBU_REDIS}:Channel", "_lookup"): "(self, exchange, routing_key, default=None)",
    (f"{KOMBU_REDIS}:QoS", "unacked_mutex_key"): None,
    (f"{KOMBU_REDIS}:QoS", "unacked_mutex_expire"): None,
    (f"{KOMBU_REDIS}:QoS", "unacked_index_key"): None,
    (f"{KOMBU_REDIS}:QoS", "visibility_timeout"): None,
    (KOMBU_REDIS, "Mutex"): "(client, name, expire)",
    (KOMBU_REDIS, "MutexHeld"): None,
    (f"{KOMBU_VIRTUAL}:Transport", "_deliver"): "(self, message, queue)",
    # the poller hands the channel's queue cycle to these two
    ("kombu.utils.scheduling:round_robin_cycle", "consume"): "(self, n)",
    ("kombu.utils.scheduling:round_robin_cycle", "rotate"): "(self, last_used)",
    # conventions.results.redis
    (CELERY_REDIS, "_set_with_state"): "(self, key, value, state)",
    (CELERY_REDIS, "_store_result"): (
        "(self, task_id, result, state, traceback=None, request=None, **kwargs)"
    ),
    (CELERY_REDIS, "get_key_for_task"): "(self, task_id, key='')",
    (CELERY_REDIS, "_get_result_meta"): (
        "(self, result, state, traceback, request, format_date=True, encode=False)"
    ),
    (CELERY_REDIS, "_MAX_STR_VALUE_SIZE"): None,
    ("celery._state", "get_current_task"): "()",
    # conventions.transport.redis on Sentinel (SentinelChannel, no URL switching) and
    # closing after a lost connection
    (f"{KOMBU_REDIS}:SentinelChannel", "_sentinel_managed_pool"): "(self, asynchronous=False)",
    (f"{KOMBU_REDIS}:SentinelChannel", "_connparams"): "(self, asynchronous=False)",
    (f"{KOMBU_REDIS}:Channel", "_closing"): None,
    (f"{KOMBU_REDIS}:Channel", "_pool"): None,
    ("kombu.connection:Connection", "cycle"): None,
    ("celery.backends.redis:SentinelBackend", "_get_pool"): "(self, **params)",
    # conventions.transport.amqp_queues: RabbitMQ's delay topology, as Celery's worker
    # step declares it
    (DELAYS, "bind_queue_to_native_delayed_delivery_exchange"): (
        "(connection: 'Connection', queue: 'Queue', prefix: 'str | None' = None) -> 'None'"
    ),
    (DELAYS, "declare_native_delayed_delivery_exchanges_and_queues"): (
        "(connection: 'Connection', queue_type: 'str', prefix: 'str | None' = None) -> 'None'"
    ),
    ("celery.app.task", "get_actual_ignore_result"): "(task, req)",
    # conventions.worker.exits: a declared dead letter's exception matches the task's
    # ``throws`` (logged "raised expected"); an unstorable return value is refused
    ("celery.app.trace", "get_log_policy"): "(task, einfo, exc)",
    ("celery.app.trace", "log_policy_expected"): None,
    ("celery.backends.base", "DisabledBackend"): None,
    # conventions.worker.consumer: the read connection carries the transport's size cap
    ("celery.worker.consumer.consumer:Consumer", "connection_for_read"): "(self, heartbeat=None)",
    ("celery.worker.consumer.consumer:Consumer", "ensure_connected"): "(self, conn)",
    ("celery.app.base:Celery", "connection_for_read"): "(self, url=None, **kwargs)",
    # conventions.config.cluster and conventions.ops.doctor_cluster: a store on Redis
    # Cluster, its guarded writes sent on the connection of their key's master
    ("redis.cluster:RedisCluster", "get_node_from_key"): "(self, key, replica=False)",
    ("redis.cluster:RedisCluster", "get_primaries"): "(self)",
    ("redis.cluster:RedisCluster", "get_default_node"): "(self)",
    ("redis.cluster:RedisCluster", "get_random_node"): "(self)",
    ("redis.cluster:NodesManager", "initialize"): None,
    # conventions.tracing.otel: the spans of opentelemetry-instrumentation-celery it
    # annotates instead of opening its own
    (f"{OTEL_CELERY}.utils", "retrieve_context"): RETRIEVE_CONTEXT,
    (f"{OTEL_CELERY}:CeleryInstrumentor", "is_instrumented_by_opentelemetry"): None,
    # read on every publish and run instead of get_tracer_provider() (which reads the
    # environment each time while no provider is set)
    ("opentelemetry.trace", "_TRACER_PROVIDER"): None,
}


def _owner(where: str) -> Any:
    module, _, qualname = where.partition(":")
    owner: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        owner = getattr(owner, part)
    return owner


@pytest.mark.parametrize(("where", "member"), list(METHODS), ids=str)
def test_a_relied_on_member_exists_with_its_signature(where: str, member: str) -> None:
    owner = _owner(where)
    name = f"{where.replace(':', '.')}.{member}"
    assert hasattr(owner, member), f"{name} is gone: conventions relies on it"
    expected = METHODS[(where, member)]
    if expected is not None:
        actual = str(inspect.signature(getattr(owner, member)))
        assert actual == expected, f"{name} changed signature: {actual}, expected {expected}"


def test_every_member_the_transport_checks_at_start_is_checked_here() -> None:
    modules = {"redis": KOMBU_REDIS, "virtual": KOMBU_VIRTUAL}
    checked = {
        (f"{modules[owner.split('.')[0]]}:{owner.split('.')[1]}", name)
        for owner, names in broker_checks.KOMBU_MEMBERS.items()
        for name in names
    }
    assert checked - set(METHODS) == set()


@pytest.mark.parametrize("package", ["kombu", "celery"])
def test_the_installed_kombu_and_celery_are_within_the_pinned_range(package: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [Requirement(r) for r in project["dependencies"]]
    pin = next(r for r in pins if r.name == package)
    installed = metadata.version(package)
    assert pin.specifier.contains(installed), f"{package} {installed} is outside {pin}"
    assert re.search(r"<\d+\.\d+(?!\.)", str(pin.specifier)), f"{pin}: pin the minor version"


def test_a_missing_member_stops_the_transport_at_start_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kombu.transport import redis as kredis

    monkeypatch.setattr(broker_checks, "_checked", [])
    monkeypatch.delattr(kredis.Channel, "_flush_brpop_reauth")  # as on kombu 5.6
    with pytest.raises(ImportError) as caught:
        broker_checks.check_kombu(object())
    message = str(caught.value)
    assert "kombu.transport.redis.Channel._flush_brpop_reauth" in message
    assert "kombu>=5.7,<5.8" in message and "\n" not in message
