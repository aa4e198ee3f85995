"""The broker contract's own test app: one app per broker, built from ``reliable()``.

The same jobs are registered on an app for Redis (the layer's transport, the run's
broker database) and one for RabbitMQ (``TEST_AMQP_URL``); both use the run's Redis
store. A worker subprocess loads one of them by name
(``celery -A tests.integration.support_contract:app worker`` with ``CC_CONTRACT_BROKER``
set to ``redis`` or ``rabbitmq``); the test process builds both with :func:`app_for`.

Every job records its effect in the store's Redis database (``INCR`` of one counter per
effect), so a test counts effects, not log lines. Nothing here imports ``tests.conftest``
(a worker reads the environment the test process set).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass

import redis
from kombu import Connection

from conventions import App, Backoff, Id, JobContext, Payload, PermanentError, TransientError
from conventions.config.profile import reliable
from conventions.schedules import entries as schedules
from conventions.task import ConventionTask

#: the brokers the contract runs against in ``make test``
BROKERS = ("redis", "rabbitmq")
#: and on a 3-node RabbitMQ cluster of the test's own (``make chaos``: three nodes take
#: about 17 s to start), given to the worker as a failover list in :data:`CLUSTER_URL_ENV`
CLUSTER = "rabbitmq-cluster"
CLUSTER_URL_ENV = "CC_CONTRACT_CLUSTER_URL"
#: which broker the module-level ``app`` (a worker's ``-A``) uses
BROKER_ENV = "CC_CONTRACT_BROKER"
#: the RabbitMQ of the run (a vhost of its own on a shared machine)
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: the one queue of the contract's jobs, and the default queue (plain tasks, never used)
QUEUE, DEFAULT_QUEUE = "cc_contract_jobs", "cc_contract_default"
#: the layer's poison exchange and queue on RabbitMQ (quorum queues dead-letter there):
#: the contract's own, never the demo's
POISON_QUEUE = "cc_contract_poison"
QUEUES = (QUEUE, DEFAULT_QUEUE, POISON_QUEUE)
#: a fleet-wide concurrency cap of one: the worker's pool of two never runs two at once
LIMITS = {"cc_contract_cap": {"concurrency": 1, "lease": 3}}
#: fast retries (on RabbitMQ the layer makes a delay under a second one second: Celery's
#: native delayed delivery cannot route it)
FAST = Backoff(base=0.2, cap=1.0, max_attempts=5)
#: how long a slow job takes (seconds)
HOLD = 0.3
#: how long a capped job holds its slot (seconds): longer than a waiting job's first
#: deferral (0.125 to 0.25 s), so that the second job really waits
CAP_HOLD = 0.5
#: the counters' key prefix in the store database
PREFIX = "cc_contract"
#: the schedule entry: the last 03:00 UTC is always within its one-day catch-up
ENTRY = schedules.Entry(
    "cc-contract-daily",
    "testing.cc_contract_report.v1",
    schedules.daily(at="03:00"),
    payload=schedules.business_date(),
    overlap="allow",
    catch_up=86400,
)


class Item(Payload):
    item_id: Id


class Report(Payload):
    business_date: dt.date


def broker_url(broker: str) -> str:
    """The broker URL of ``broker``: the run's Redis broker database, or its RabbitMQ."""
    if broker == "redis":
        return os.environ["REDIS_URL"]
    if broker == "rabbitmq":
        return AMQP_URL
    if broker == CLUSTER:
        return os.environ[CLUSTER_URL_ENV]
    raise ValueError(f"unknown broker {broker!r}; one of {(*BROKERS, CLUSTER)}")


def counters() -> redis.Redis:
    """The store's Redis database, where the jobs count their effects."""
    return redis.Redis.from_url(os.environ["CONVENTIONS_STORE_URL"], decode_responses=True)


def effect_key(name: str) -> str:
    return f"{PREFIX}:effect:{name}"


def effects(name: str) -> int:
    with counters() as client:
        return int(client.get(effect_key(name)) or 0)


def _count(name: str) -> None:
    with counters() as client:
        client.incr(effect_key(name))


@dataclass(frozen=True)
class Jobs:
    """The contract's jobs, as registered on one app."""

    effect: ConventionTask
    slow: ConventionTask
    flaky: ConventionTask
    doomed: ConventionTask
    capped: ConventionTask
    report: ConventionTask


def _register(app: App) -> Jobs:
    @app.job("testing.cc_contract_effect.v1", payload=Item, key="cce:{item_id}",
             workload="contract")  # fmt: skip
    def effect(payload: Item, ctx: JobContext) -> str:
        _count(payload.item_id)
        return payload.item_id

    @app.job("testing.cc_contract_slow.v1", payload=Item, key="ccs:{item_id}",
             workload="contract")  # fmt: skip
    def slow(payload: Item, ctx: JobContext) -> str:
        """Takes a while first: a second publish of its key finds it pending or running."""
        time.sleep(HOLD)
        _count(payload.item_id)
        return payload.item_id

    @app.job("testing.cc_contract_flaky.v1", payload=Item, key="ccf:{item_id}",
             workload="contract", backoff=FAST)  # fmt: skip
    def flaky(payload: Item, ctx: JobContext) -> str:
        """Fails transiently twice (each attempt's time recorded), then takes effect and
        publishes a child job."""
        with counters() as client:
            client.rpush(f"{PREFIX}:attempts:{payload.item_id}", time.time())
        if ctx.attempt < 3:
            raise TransientError(f"provider busy (attempt {ctx.attempt})")
        _count(payload.item_id)
        return str(effect.delay(item_id=f"{payload.item_id}-child").id)

    @app.job("testing.cc_contract_doomed.v1", payload=Item, key="ccd:{item_id}",
             workload="contract")  # fmt: skip
    def doomed(payload: Item, ctx: JobContext) -> str:
        """Fails for good until the test marks its cause fixed (then a replay succeeds)."""
        with counters() as client:
            fixed = client.exists(f"{PREFIX}:fixed:{payload.item_id}")
        if not fixed:
            raise PermanentError(f"no such account {payload.item_id}")
        _count(payload.item_id)
        return payload.item_id

    @app.job("testing.cc_contract_capped.v1", payload=Item, key="ccc:{item_id}",
             workload="contract", uses=("cc_contract_cap",))  # fmt: skip
    def capped(payload: Item, ctx: JobContext) -> str:
        """Counts how many capped jobs run at once (the most is kept)."""
        with counters() as client:
            now = client.incr(f"{PREFIX}:in_flight")
            client.eval(
                "if tonumber(redis.call('get', KEYS[1]) or 0) < tonumber(ARGV[1]) then "
                "redis.call('set', KEYS[1], ARGV[1]) end", 1, f"{PREFIX}:most", now,
            )  # fmt: skip
            time.sleep(CAP_HOLD)
            client.decr(f"{PREFIX}:in_flight")
        _count(payload.item_id)
        return payload.item_id

    @app.job("testing.cc_contract_report.v1", payload=Report, key="ccr:{business_date}",
             workload="contract")  # fmt: skip
    def report(payload: Report, ctx: JobContext) -> str:
        _count(f"report:{payload.business_date.isoformat()}")
        return payload.business_date.isoformat()

    return Jobs(effect, slow, flaky, doomed, capped, report)


_APPS: dict[str, tuple[App, Jobs]] = {}


def _build(broker: str) -> tuple[App, Jobs]:
    app = App(f"cc_contract_{broker}", set_as_current=False)
    redis_broker = os.environ["REDIS_URL"]
    # one result backend for both (Redis): the contract is about the broker
    app.conf.update(
        reliable(
            broker_url=broker_url(broker),
            store_url=os.environ["CONVENTIONS_STORE_URL"],
            result_backend=redis_broker,
        )
    )
    levels = os.environ.get("CONVENTIONS_DOCTOR_LEVELS", "")
    app.conf.update(
        task_default_queue=DEFAULT_QUEUE,
        conventions_workloads={"contract": QUEUE},
        conventions_limits=LIMITS,
        conventions_lease_seconds=3.0,
        conventions_poison_queue=POISON_QUEUE,
        conventions_schedule=[ENTRY],
        conventions_doctor_levels=dict(item.split("=", 1) for item in levels.split(",") if item),
    )
    return app, _register(app)


def app_for(broker: str) -> tuple[App, Jobs]:
    """The contract app of ``broker`` and its jobs (built once per process)."""
    if broker not in _APPS:
        _APPS[broker] = _build(broker)
    return _APPS[broker]


def reset_rabbitmq_queues(url: str = AMQP_URL) -> None:
    """Delete the contract's queues and exchanges on RabbitMQ (a run before may have left
    them, declared with other arguments); the worker declares them again."""
    with Connection(url, connect_timeout=5) as connection:
        channel = connection.channel()
        for name in QUEUES:
            channel.queue_delete(name)
            channel.exchange_delete(name)
        channel.close()


app, jobs = app_for(os.environ.get(BROKER_ENV, "redis"))
