"""One contract, two brokers: what the layer promises holds on Redis and on RabbitMQ.

Every test runs twice, with ``broker`` = ``redis`` (the layer's transport, the run's
broker database) and ``rabbitmq`` (``TEST_AMQP_URL``), each against a real prefork
``celery worker`` subprocess of the contract's own app
(:mod:`tests.integration.support_contract`, built from ``reliable()``) and the run's real
Redis store. One worker per broker for the whole module; effects are counted in the
store, so each test asserts what happened, not what was logged.

In ``make chaos`` every test runs a third time, ``broker`` = ``rabbitmq-cluster``: a
3-node RabbitMQ cluster of the module's own (:mod:`tests.acceptance.rabbit_cluster`;
quorum queues of three members, leaders spread), the app and worker given the failover
list of the three nodes' URLs.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from kombu import Connection, Producer

from conventions import App, bind
from conventions.ops.replay import ReplayRefused, replay
from conventions.schedules.beat import Scheduler
from conventions.schedules.cadence import now
from conventions.store.records import AuditEvent, Category, DeadLetter
from conventions.transactional import outbox
from conventions.transactional.relay import Relay
from tests.acceptance import rabbit_cluster, rabbit_node
from tests.acceptance.support_chaos import ROOT, Worker
from tests.fixtures import unavailable
from tests.integration import support_contract as sc
from tests.integration.helpers import publish_foreign, wait_for

#: seconds a job of the contract may take end to end (retries and deferrals included)
WITHIN = 30


@dataclass
class Contract:
    """One broker's side of the contract: its app, its jobs and its worker."""

    broker: str
    app: App
    jobs: sc.Jobs
    worker: Worker

    def trail(self, correlation_id: str) -> list[AuditEvent]:
        return self.app.store.audit_for(correlation_id)

    def dead_letter(self, task_id: str) -> DeadLetter | None:
        found = [r for r in self.app.store.list_dead_letters(limit=1000) if r.task_id == task_id]
        return found[0] if found else None


def _reachable(broker: str) -> None:
    try:
        with Connection(sc.broker_url(broker), connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        unavailable(f"the {broker} broker", exc)


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 3-node RabbitMQ cluster of the module's own; its failover URL, also in
    :data:`~tests.integration.support_contract.CLUSTER_URL_ENV` (for the worker)."""
    if not rabbit_node.installed():
        unavailable("rabbitmq-server (a cluster of the test's own)", FileNotFoundError("rabbitmq"))
    with rabbit_cluster.private_cluster(tmp_path_factory.mktemp("rabbit-cluster")) as cluster:
        os.environ[sc.CLUSTER_URL_ENV] = cluster.url
        try:
            yield cluster.url
        finally:
            os.environ.pop(sc.CLUSTER_URL_ENV, None)


@pytest.fixture(
    scope="module", params=[*sc.BROKERS, pytest.param(sc.CLUSTER, marks=pytest.mark.chaos)]
)
def contract(
    request: pytest.FixtureRequest, services: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Contract]:
    """The app of one broker and a worker subprocess on it (one per broker per module)."""
    broker = str(request.param)
    if broker == sc.CLUSTER:
        request.getfixturevalue("cluster_url")
    _reachable(broker)
    if broker == "rabbitmq":
        sc.reset_rabbitmq_queues()
    app, jobs = sc.app_for(broker)
    folder = tmp_path_factory.mktemp(f"contract-{broker}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), sc.BROKER_ENV: broker}
    worker = Worker(
        "tests.integration.support_contract:app", f"contract-{broker}", sc.QUEUE, env, folder
    )
    try:
        # the worker starts before anything was published: on RabbitMQ it declares the
        # quorum queues, the poison queue and the delay exchanges itself, before Celery's
        # delayed-delivery step binds to them (which gives up for good on missing ones)
        worker.wait_ready()
        warm = jobs.effect.delay(item_id="warm-up")
        assert warm.get(timeout=WITHIN) == "warm-up"
        assert "Failed to setup delayed delivery" not in worker.output(), worker.output()[-3000:]
        yield Contract(broker, app, jobs, worker)
    finally:
        worker.terminate(timeout=30)
        if broker == "rabbitmq":
            sc.reset_rabbitmq_queues()


@pytest.fixture
def side(contract: Contract, store_redis: redis.Redis) -> Contract:
    """The contract with an empty store (the worker keeps running)."""
    store_redis.flushdb()
    assert contract.worker.alive(), contract.worker.output()[-3000:]
    return contract


def _names(events: list[AuditEvent], task_id: str | None = None) -> list[str]:
    return [e.event for e in events if task_id is None or e.task_id == task_id]


def _new(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_second_delay_with_the_same_key_is_deduplicated_and_runs_once(side: Contract) -> None:
    item = _new("dedup")
    with bind(correlation_id=f"corr-{item}") as trace:
        first = side.jobs.slow.delay(item_id=item)
        second = side.jobs.slow.delay(item_id=item)  # the first is pending or running
    assert (second.deduplicated, second.id) == (True, first.id)
    assert first.get(timeout=WITHIN) == item
    assert sc.effects(item) == 1
    trail = wait_for(lambda: _finished(side, trace.correlation_id, first.id), timeout=WITHIN)
    assert _names(trail).count("deduplicated") == 1
    assert _names(trail, first.id).count("started") == 1


def test_a_job_published_again_after_it_took_effect_does_not_repeat_it(side: Contract) -> None:
    item = _new("ledger")
    first = side.jobs.effect.delay(item_id=item)
    assert first.get(timeout=WITHIN) == item
    again = side.jobs.effect.delay(item_id=item)  # until_done: the key is free, it publishes
    assert again.deduplicated is False
    # the same job as another producer sends it again (a redelivery, a replayed message)
    with Connection(side.app.conf.broker_url) as connection:
        copy = publish_foreign(
            Producer(connection), side.jobs.effect.name, {"item_id": item}, sc.QUEUE
        )
    # the ledger says done: both bodies skipped
    assert again.get(timeout=WITHIN) is None
    assert side.app.AsyncResult(copy).get(timeout=WITHIN) is None
    assert sc.effects(item) == 1


def test_a_transient_error_is_retried_with_backoff_and_carries_its_correlation_to_the_child(
    side: Contract,
) -> None:
    item = _new("flaky")
    with bind(correlation_id=f"corr-{item}") as trace:
        root = side.jobs.flaky.delay(item_id=item)
    child_id = root.get(timeout=WITHIN)
    assert side.app.AsyncResult(child_id).get(timeout=WITHIN) == f"{item}-child"
    assert (sc.effects(item), sc.effects(f"{item}-child")) == (1, 1)

    trail = wait_for(lambda: _finished(side, trace.correlation_id, child_id), timeout=WITHIN)
    retried = [e for e in trail if e.task_id == root.id and e.event == "retried"]
    assert len(retried) == 2 and _names(trail, root.id)[-1] == "succeeded"
    # each attempt came after the delay its retry announced (the backoff), not at once
    with sc.counters() as client:
        times = [float(t) for t in client.lrange(f"{sc.PREFIX}:attempts:{item}", 0, -1)]
    assert len(times) == 3
    for gap, event in zip([b - a for a, b in itertools.pairwise(times)], retried, strict=True):
        assert gap >= float(event.detail["delay"]) - 0.05, (times, retried)
    # one story: the child job's events are under the same correlation id, caused by the root
    child = [e for e in trail if e.task_id == child_id]
    assert _names(child)[-1] == "succeeded"
    assert {e.causation_id for e in child if e.event == "started"} == {f"job:{root.id}"}


def test_a_permanent_error_is_dead_lettered_and_its_replay_is_audited_and_runs_once(
    side: Contract,
) -> None:
    item = _new("doomed")
    with bind(correlation_id=f"corr-{item}") as trace:
        failed = side.jobs.doomed.delay(item_id=item)
    record = wait_for(lambda: side.dead_letter(failed.id), timeout=WITHIN)
    assert record.category is Category.PERMANENT
    assert f"no such account {item}" in record.message
    assert sc.effects(item) == 0

    with sc.counters() as client:
        client.set(f"{sc.PREFIX}:fixed:{item}", 1)  # the cause is fixed: replay it
    replayed = replay(side.app, record.id, reason="account created", actor="contract-test")
    assert replayed.get(timeout=WITHIN) == item
    assert sc.effects(item) == 1
    with pytest.raises(ReplayRefused, match="already replayed"):
        replay(side.app, record.id, reason="again", actor="contract-test")
    # forced, it is published once more: the ledger knows the key is done
    forced = replay(side.app, record.id, reason="forced", actor="contract-test", force=True)
    assert forced.get(timeout=WITHIN) is None
    assert sc.effects(item) == 1

    trail = side.trail(trace.correlation_id)
    [audit] = [e for e in trail if e.event == "replayed" and e.task_id == replayed.id]
    assert (audit.detail["actor"], audit.detail["reason"]) == ("contract-test", "account created")
    assert audit.detail["replay_of_task_id"] == failed.id
    assert _names(trail, replayed.id)[-1] == "succeeded"
    assert "skipped_duplicate" in _names(trail, forced.id)


def test_a_schedule_entry_is_sent_once_per_business_key_by_two_beats(
    side: Contract, tmp_path: Path
) -> None:
    beats = [
        Scheduler(side.app, schedule_filename=str(tmp_path / f"beat-{n}"), lazy=False)
        for n in (1, 2)
    ]
    try:
        sent = [beat.apply_async(beat.schedule[sc.ENTRY.name]) for beat in beats]
    finally:
        for beat in beats:
            beat.close()
    assert sent[0] is not None and sent[1] is not None
    assert sent[1].id == sent[0].id  # the second beat found the occurrence sent
    label = sent[0].get(timeout=WITHIN)
    assert sc.effects(f"report:{label}") == 1
    occurrence = sc.ENTRY.occurrence(sc.ENTRY.schedule.latest(now()) or now())
    assert occurrence.key == f"beat:{sc.ENTRY.name}:{label}"
    trail = wait_for(lambda: _finished(side, occurrence.correlation_id, sent[0].id), timeout=WITHIN)
    assert _names(trail).count("deduplicated") == 1
    assert _names(trail, sent[0].id).count("started") == 1


def test_the_outbox_relay_publishes_a_committed_row_onto_the_broker_once(
    side: Contract, tmp_path: Path
) -> None:
    item = _new("outbox")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'outbox.sqlite3'}")
    outbox.create_table(engine)
    with engine.begin() as connection:
        task_id = outbox.add(connection, side.jobs.effect, item_id=item)
    relay = Relay(side.app, engine)
    published = relay.drain()
    assert (published.published, published.failed, published.unavailable) == (1, 0, None)
    assert side.app.AsyncResult(task_id).get(timeout=WITHIN) == item
    assert relay.drain().claimed == 0  # marked published: never sent twice
    assert sc.effects(item) == 1
    engine.dispose()


def test_a_concurrency_limit_of_one_holds_on_a_pool_of_two(side: Contract) -> None:
    items = [_new(f"capped{n}") for n in range(3)]
    with bind(correlation_id=_new("corr-capped")) as trace:
        results = [side.jobs.capped.delay(item_id=item) for item in items]

    def ended() -> bool:
        done = all(r.ready() for r in results)
        return done or any(side.dead_letter(r.id) for r in results)

    wait_for(ended, timeout=WITHIN * 2, every=0.2)
    dead = [side.dead_letter(r.id) for r in results]
    assert dead == [None] * len(results), [(d.category, d.message) for d in dead if d]
    assert [r.get(timeout=WITHIN) for r in results] == items
    # both pool processes had a capped job at once: the second waited for the slot
    assert "deferred" in _names(side.trail(trace.correlation_id))
    assert [sc.effects(item) for item in items] == [1] * len(items)
    with sc.counters() as client:
        assert client.get(f"{sc.PREFIX}:most") == "1"


def _finished(side: Contract, correlation_id: str, task_id: str) -> list[AuditEvent] | None:
    """The trail once ``task_id`` has succeeded (the audit is written after the result)."""
    trail = side.trail(correlation_id)
    return trail if "succeeded" in _names(trail, task_id) else None
