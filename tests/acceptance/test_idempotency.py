"""Idempotency, shown end to end: real Redis, real PostgreSQL, real worker processes.

A payment event moves money: ``payments.apply_event.v1`` must take effect once however
often it is published, delivered or interrupted. ``shop.apply_payment`` is deliberately
not idempotent, so a double application shows in the database as an order whose
``paid_minor`` is above the sum of its events.

Event ids used here (no other test touches them): ``evt_0101``..``evt_1100`` for the
chaos run, ``evt_1101`` for the crash after the commit, ``evt_1102`` for the publish
race, ``evt_1103`` for the visibility timeout.

On Redis, kombu puts back the unacknowledged messages of a dead worker only when some
worker sweeps them: every worker sweeps once when it starts consuming, then about every
100 s (``unacked_restore_interval`` x ``unacked_restore_throttle``); a sweep restores the
messages delivered longer than the visibility timeout ago. The tests below shorten the
visibility timeout (``CONVENTIONS_VISIBILITY_TIMEOUT``) and start a worker after it has
passed, so that the redelivery happens within the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from kombu import Connection, Producer
from sqlalchemy import text

from conventions.store import keys
from conventions.store.redis import RedisStore
from conventions.transport import layout
from conventions.transport.redis import in_inboxes
from tasks import app, db, shop
from tasks.payments import apply_event
from tests.acceptance import support_crash
from tests.acceptance.support_chaos import chaos_seed
from tests.fixtures import WorkerProcess
from tests.integration.helpers import publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

QUEUE = "email"
#: kombu's Redis transport keeps delivered, unacknowledged messages here (a hash of
#: delivery tags, and a sorted set of their delivery times)
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
#: kombu's Redis restore mutex (``unacked_mutex_key``)
UNACKED_MUTEX = "unacked_mutex"
#: the test-only jobs, on top of the shared ones
INCLUDE = "tests.integration.support_jobs,tests.acceptance.support_crash"

CHAOS_FIRST = 101
CHAOS_EVENTS = 1000
CHAOS_LAST = CHAOS_FIRST + CHAOS_EVENTS - 1
CHAOS_FOREIGN_EVERY = 10  # every 10th event also arrives from a foreign producer
CHAOS_FOREIGN = CHAOS_EVENTS // CHAOS_FOREIGN_EVERY
#: running jobs killed with their pool process, at least
CHAOS_RUNNING_JOBS_KILLED = 5
#: whole workers (main process and pool) killed, then replaced
CHAOS_WORKERS_KILLED = 2
#: kills in all, at most: one every 0.1-0.5 s while the backlog lasts (about 30 s), so
#: that some payment job dies between its commit and its ack (about one lost job in ten)
MAX_KILLS = 150
#: the chaos workers' visibility timeout (seconds): above the longest deferral (the
#: lease, 3 s here) so that a live worker's held messages are not swept
CHAOS_VISIBILITY = 6
CRASH_EVENT_NUMBER = 1101
RACE_EVENT_NUMBER = 1102
SLOW_EVENT_NUMBER = 1103
LAST_SEEDED = 1103
SLOW_VISIBILITY = 3
#: the chaos run's id ranges, as SQL ``BETWEEN :low AND :high`` bounds
CHAOS_EVENT_RANGE = {"low": f"evt_{CHAOS_FIRST:04d}", "high": f"evt_{CHAOS_LAST:04d}"}
CHAOS_ORDER_RANGE = {"low": f"ord_{CHAOS_FIRST:04d}", "high": f"ord_{CHAOS_LAST:04d}"}
UNAPPLIED = (
    "SELECT count(*) FROM payment_events WHERE id BETWEEN :low AND :high AND applied_at IS NULL"
)
#: what a worker logs when a pool process died while it ran a job
LOST_RUNNING_JOB = "Task handler raised error: WorkerLostError"
#: what ``payments.apply_event.v1`` returns when ``once()`` found its marker
ALREADY = "'already applied'"
#: what the runner logs when a delivery finds its key held, or already done
DEFERRED = ": key held by a live run"  # the runner's "deferred <n>s: <reason>" line
SKIPPED = "already done, body skipped"


def _event_id(number: int) -> str:
    return f"evt_{number:04d}"


def _order_id(number: int) -> str:
    return f"ord_{number:04d}"


def _seed() -> None:
    """Orders ``ord_0001``..``ord_1103``, one payment event each (idempotent)."""
    with db.transaction() as session:
        shop.seed(session, customers=3, orders=LAST_SEEDED)


def _scalar(sql: str, **params: Any) -> Any:
    with db.transaction() as session:
        return session.execute(text(sql), params).scalar_one()


def _rows(sql: str, **params: Any) -> list[Any]:
    with db.transaction() as session:
        return list(session.execute(text(sql), params).all())


def _message_id(raw: str) -> str:
    return str(json.loads(raw)["headers"]["id"])


class ForeignProducer:
    """Messages from a foreign producer (raw kombu, Celery protocol 2, none of our
    headers): they never pass through the publish-side dedup."""

    def __init__(self) -> None:
        self.connection = Connection(app.conf.broker_url)
        self.producer = Producer(self.connection)

    def publish(self, task: str, kwargs: dict[str, Any]) -> str:
        return publish_foreign(self.producer, task, kwargs, QUEUE)

    def close(self) -> None:
        self.connection.close()


def _children(pid: int) -> list[int]:
    """The pool processes of a worker's main process."""
    listed = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(field) for field in listed.stdout.split()]


def _running_ledger_keys(store: redis.Redis) -> list[str]:
    return [
        key
        for key in store.scan_iter(match=keys.ledger("*"), count=1000)
        if store.hget(key, "state") == "running"
    ]


def _nothing_left(broker: redis.Redis, store: redis.Redis, stale: set[str]) -> bool:
    """No message queued, none fetched into an inbox, none delivered and unacknowledged
    (but the ``stale`` ones a worker killed before this test left behind), none waiting
    out a countdown, no ledger lease held."""
    unacked = set(broker.hkeys(UNACKED)) - stale
    return (
        broker.llen(QUEUE) == 0
        and in_inboxes(broker) == 0
        and not unacked
        and not _running_ledger_keys(store)
        # a job retried or deferred with a countdown waits in the delayed set
        and broker.zcard(layout.DELAYED.format(queue=QUEUE)) == 0
    )


def _count(workers: list[WorkerProcess], text: str) -> int:
    return sum(worker.output().count(text) for worker in workers)


def _payments_rerun_after_commit(workers: list[WorkerProcess]) -> int:
    """Payment jobs that found their effect committed by an earlier, killed run."""
    return sum(
        1
        for worker in workers
        for line in worker.output().splitlines()
        if f"{apply_event.name}[" in line and "succeeded in" in line and ALREADY in line
    )


def _unfinished(worker: WorkerProcess) -> set[str]:
    """The jobs a worker received and had not finished when it stopped (its log's last
    word about them is "received")."""
    pending: set[str] = set()
    for task_id, event in re.findall(
        r"Task \S+\[([0-9a-f-]+)\] (received|succeeded|ignored|failed)", worker.output()
    ):
        (pending.add if event == "received" else pending.discard)(task_id)
    return pending


def _received(worker: WorkerProcess, task_id: str) -> bool:
    return f"[{task_id}] received" in worker.output()


def _results(broker: redis.Redis, task_ids: list[str]) -> list[tuple[str, str]]:
    """The stored (state, result) of each job: result "applied", "already applied", or
    "None" when the ledger skipped the body."""
    raw = broker.mget([f"celery-task-meta-{task_id}" for task_id in task_ids])
    ends = [{} if value is None else json.loads(value) for value in raw]
    return [(str(end.get("status", "MISSING")), str(end.get("result"))) for end in ends]


# -- 1. publish-side dedup under a race -------------------------------------------------


def test_fifty_threads_publishing_one_event_enqueue_one_job(broker_redis: redis.Redis) -> None:
    event_id = _event_id(RACE_EVENT_NUMBER)
    before = broker_redis.llen(QUEUE)
    barrier = threading.Barrier(50)
    results: list[Any] = [None] * 50
    errors: list[BaseException] = []

    def publish(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = apply_event.delay(event_id=event_id)
        except BaseException as exc:  # reported below, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert errors == []
        first = [r for r in results if r.deduplicated is False]
        duplicates = [r for r in results if r.deduplicated is True]
        assert len(first) == 1
        assert len(duplicates) == 49
        assert {r.id for r in duplicates} == {first[0].id}
        assert broker_redis.llen(QUEUE) == before + 1
        queued = [_message_id(raw) for raw in broker_redis.lrange(QUEUE, 0, -1)]
        assert queued.count(first[0].id) == 1
    finally:  # leave no job behind for a later worker
        for raw in broker_redis.lrange(QUEUE, 0, -1):
            if any(r is not None and _message_id(raw) == r.id for r in results):
                broker_redis.lrem(QUEUE, 0, raw)


# -- 2. a thousand events through kill -9 -------------------------------------------------


class Killer(threading.Thread):
    """At random moments, ``kill -9`` a random pool process of a random live worker, or
    (``CHAOS_WORKERS_KILLED`` times, early) a whole worker: its main process, then its
    orphaned pool. A killed worker is replaced, in the background, once its messages are
    older than the visibility timeout, so that the new worker's first sweep puts them
    back. Goes on until the whole workers and ``CHAOS_RUNNING_JOBS_KILLED`` running jobs
    were killed and one payment job died after its commit (its redelivery logged
    "already applied"); at most ``MAX_KILLS`` kills."""

    def __init__(self, start_worker: Callable[[str], WorkerProcess], count: int) -> None:
        super().__init__(daemon=True)
        self.start_worker = start_worker
        self.live = [start_worker(f"chaos{n}") for n in range(1, count + 1)]
        self.all = list(self.live)
        self.dead: list[WorkerProcess] = []
        self.replacing: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.children_killed = 0
        self.stop = threading.Event()
        self.rng = random.Random(chaos_seed("idempotency-killer"))
        self.kill_worker_at = set(self.rng.sample(range(1, 25), CHAOS_WORKERS_KILLED))

    def goal_reached(self) -> bool:
        with self.lock:
            workers = list(self.all)
        return (
            len(self.dead) >= CHAOS_WORKERS_KILLED
            and _count(workers, LOST_RUNNING_JOB) >= CHAOS_RUNNING_JOBS_KILLED
            and _payments_rerun_after_commit(workers) >= 1
        )

    def run(self) -> None:
        kills = 0
        while kills < MAX_KILLS and not self.goal_reached():
            if self.stop.wait(self.rng.uniform(0.1, 0.5)):
                break
            kills += 1
            with self.lock:
                live = list(self.live)
            if not live:
                continue  # every worker is being replaced
            if kills in self.kill_worker_at:
                self.kill_worker(self.rng.choice(live))
            else:
                self.kill_child(self.rng.choice(live))
        for thread in self.replacing:
            thread.join()

    def kill_child(self, worker: WorkerProcess) -> None:
        children = _children(worker.proc.pid)
        if children:  # none while the worker replaces a killed process
            try:
                os.kill(self.rng.choice(children), signal.SIGKILL)
                self.children_killed += 1
            except ProcessLookupError:
                pass

    def kill_worker(self, victim: WorkerProcess) -> None:
        pool = _children(victim.proc.pid)
        victim.proc.kill()  # SIGKILL: no warm shutdown, its messages stay unacked
        killed_at = time.time()
        victim.proc.wait(10)
        for pid in pool:  # the orphaned pool goes down with it, as with a lost machine
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with self.lock:
            self.live.remove(victim)
            self.dead.append(victim)
            name = f"chaos-replacement{len(self.dead)}"
        thread = threading.Thread(target=self.replace, args=(name, killed_at), daemon=True)
        self.replacing.append(thread)
        thread.start()

    def replace(self, name: str, killed_at: float) -> None:
        # the dead worker's messages come back at the next sweep that finds them older
        # than the visibility timeout: the replacement's first one
        time.sleep(max(0.0, killed_at + CHAOS_VISIBILITY + 0.5 - time.time()))
        # a worker killed mid-sweep leaves kombu's restore mutex held for up to 5 minutes
        broker = redis.Redis.from_url(app.conf.broker_url)
        broker.delete(UNACKED_MUTEX)
        broker.close()
        replacement = self.start_worker(name)
        with self.lock:
            self.live.append(replacement)
            self.all.append(replacement)


def _publish_every_event_twice_and_some_from_abroad(
    event_ids: list[str],
) -> tuple[dict[str, list[str]], int]:
    """Each event twice through the layer (the second publish is deduplicated while the
    first job is pending); every 10th also from a foreign producer, right behind its
    first copy so that both copies run at the same time. Returns the ids of the jobs
    really enqueued, per event, and how many publishes were deduplicated."""
    jobs: dict[str, list[str]] = {event_id: [] for event_id in event_ids}
    foreign = ForeignProducer()
    try:
        for index, event_id in enumerate(event_ids):
            jobs[event_id].append(apply_event.delay(event_id=event_id).id)
            if index % CHAOS_FOREIGN_EVERY == 0:
                jobs[event_id].append(foreign.publish(apply_event.name, {"event_id": event_id}))
    finally:
        foreign.close()
    deduplicated = 0
    for event_id in event_ids:
        again = apply_event.delay(event_id=event_id)
        if again.deduplicated:
            assert again.id == jobs[event_id][0]
            deduplicated += 1
        else:
            jobs[event_id].append(again.id)
    return jobs, deduplicated


def _settle(broker: redis.Redis, store: redis.Redis, stale: set[str]) -> int:
    """Wait until every event is applied and nothing is left; or until nothing was left
    for 30 s with events still unapplied (their messages are gone). Returns how many
    events were never applied."""
    deadline = time.monotonic() + 240
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        unapplied = _scalar(UNAPPLIED, **CHAOS_EVENT_RANGE)
        quiet = _nothing_left(broker, store, stale)
        if quiet and unapplied == 0:
            return 0
        if not quiet:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 30:
            return int(unapplied)
        time.sleep(1.0)
    raise AssertionError("the run did not settle within 240 s")


def _where_the_unapplied_went(jobs: dict[str, list[str]], workers: list[WorkerProcess]) -> str:
    """What the workers' logs and the dead letters say of each unapplied event's jobs."""
    unapplied = [
        str(row[0])
        for row in _rows(
            "SELECT id FROM payment_events WHERE id BETWEEN :low AND :high"
            " AND applied_at IS NULL ORDER BY id",
            **CHAOS_EVENT_RANGE,
        )
    ]
    said = [f"unapplied: {unapplied}; dead letters: {app.store.count_dead_letters()}"]
    for event_id in unapplied:
        for task_id in jobs.get(event_id, []):
            said.append(f"{event_id} job {task_id}:")
            said.extend(
                f"  {worker.name}: {line}"
                for worker in workers
                for line in worker.output().splitlines()
                if task_id in line
            )
    return "\n".join(said)


def _assert_each_order_holds_the_sum_of_its_events_once(lost_events: int) -> None:
    assert _scalar(UNAPPLIED, **CHAOS_EVENT_RANGE) == lost_events
    markers = _scalar(
        "SELECT count(*) FROM cc_processed_jobs WHERE key BETWEEN :low AND :high",
        low=f"payment-event:{CHAOS_EVENT_RANGE['low']}",
        high=f"payment-event:{CHAOS_EVENT_RANGE['high']}",
    )
    assert markers == CHAOS_EVENTS - lost_events
    wrong_orders = _scalar(
        """
        SELECT count(*) FROM orders o
        WHERE o.id BETWEEN :low AND :high
          AND o.paid_minor <> (SELECT sum(e.amount_minor) FROM payment_events e
                               WHERE e.order_id = o.id)
        """,
        **CHAOS_ORDER_RANGE,
    )
    assert wrong_orders == lost_events  # a lost event's order holds nothing, none twice
    paid_total = _scalar(
        "SELECT sum(paid_minor) FROM orders WHERE id BETWEEN :low AND :high", **CHAOS_ORDER_RANGE
    )
    event_total = _scalar(
        "SELECT sum(amount_minor) FROM payment_events WHERE id BETWEEN :low AND :high"
        " AND applied_at IS NOT NULL",
        **CHAOS_EVENT_RANGE,
    )
    assert paid_total == event_total
    paid_orders = _scalar(
        "SELECT count(*) FROM orders WHERE id BETWEEN :low AND :high AND status = 'paid'",
        **CHAOS_ORDER_RANGE,
    )
    assert paid_orders == CHAOS_EVENTS - lost_events


@pytest.mark.chaos
@pytest.mark.timeout(420)
def test_a_thousand_events_published_twice_survive_kill_nine_and_take_effect_once(
    worker_process: Callable[..., WorkerProcess],
    broker_redis: redis.Redis,
    store_redis: redis.Redis,
) -> None:
    _seed()
    event_ids = [_event_id(n) for n in range(CHAOS_FIRST, CHAOS_LAST + 1)]
    assert _scalar(UNAPPLIED, **CHAOS_EVENT_RANGE) == CHAOS_EVENTS  # none applied before
    broker_redis.delete(QUEUE)
    stale = set(broker_redis.hkeys(UNACKED))
    started = time.monotonic()
    killer = Killer(
        lambda name: worker_process(
            name, QUEUE, 2, CONVENTIONS_VISIBILITY_TIMEOUT=str(CHAOS_VISIBILITY)
        ),
        count=2,
    )
    killer.start()
    jobs, deduplicated = _publish_every_event_twice_and_some_from_abroad(event_ids)
    published = time.monotonic()
    try:
        lost_events = _settle(broker_redis, store_redis, stale)
    finally:
        killer.stop.set()
        killer.join(70)
    drained = time.monotonic()

    # nothing applied twice, nothing lost: a whole worker killed mid-fetch leaves the
    # message in its inbox (conventions.transport.redis), given back by the replacement's sweep
    assert lost_events == 0, _where_the_unapplied_went(jobs, killer.all)
    _assert_each_order_holds_the_sum_of_its_events_once(lost_events)
    assert app.store.count_dead_letters() == 0
    # every job enqueued (duplicates included) succeeded; per event, at most one reports
    # "applied" (none when the run that applied it died after its commit: its redelivery
    # then reports "already applied")
    assert sum(len(ids) for ids in jobs.values()) == 2 * CHAOS_EVENTS + CHAOS_FOREIGN - deduplicated
    ends = {event_id: _results(broker_redis, ids) for event_id, ids in jobs.items()}
    unfinished = {e for e, end in ends.items() if any(state != "SUCCESS" for state, _ in end)}
    assert len(unfinished) == lost_events
    applied = Counter(sum(result == "applied" for _, result in end) for end in ends.values())
    assert set(applied) <= {0, 1}
    rerun_after_commit = sum(
        any(result == "already applied" for _, result in end) for end in ends.values()
    )
    # the chaos happened: whole workers and running jobs were killed, their messages
    # delivered again, and at least one payment job died after its commit, so that only
    # once() stood between its redelivery and a second payment
    lost = _count(killer.all, LOST_RUNNING_JOB)
    assert len(killer.dead) == CHAOS_WORKERS_KILLED
    assert lost >= CHAOS_RUNNING_JOBS_KILLED
    assert rerun_after_commit >= 1
    # the jobs the dead workers held were delivered again, to another worker
    stranded = {(worker, task_id) for worker in killer.dead for task_id in _unfinished(worker)}
    assert len(stranded) >= 1
    for dead, task_id in stranded:
        assert any(_received(worker, task_id) for worker in killer.all if worker is not dead)
    # receipts: a kill after the payment's commit and before the receipt's publish loses
    # that receipt (delivery-guarantees.md, crash window 7): only the orders whose
    # payment was rerun after its commit may lack one
    receipts = _scalar(
        "SELECT count(*) FROM sent_emails WHERE order_id BETWEEN :low AND :high",
        **CHAOS_ORDER_RANGE,
    )
    assert CHAOS_EVENTS - rerun_after_commit - lost_events <= receipts <= CHAOS_EVENTS

    outcomes = Counter(result for end in ends.values() for _, result in end)
    print(
        f"\nchaos: {CHAOS_EVENTS} events, {2 * CHAOS_EVENTS} publishes ({deduplicated} "
        f"deduplicated) + {CHAOS_FOREIGN} foreign; {len(killer.dead)} workers and "
        f"{killer.children_killed} pool processes killed ({len(stranded)} jobs stranded on "
        f"the dead workers, {lost} lost with their pool process); "
        f"{_count(killer.all, DEFERRED)} deferrals, "
        f"{_count(killer.all, SKIPPED)} ledger skips; outcomes {dict(outcomes)}; receipts "
        f"{receipts}; published {published - started:.1f}s, drained {drained - started:.1f}s"
    )


# -- 3. a crash between the business commit and the ack ---------------------------------


def test_a_job_whose_worker_dies_after_the_commit_is_not_applied_twice(
    worker_process: Callable[..., WorkerProcess],
    broker_redis: redis.Redis,
    store_redis: redis.Redis,
) -> None:
    _seed()
    event_id = _event_id(CRASH_EVENT_NUMBER)
    order_id = _order_id(CRASH_EVENT_NUMBER)
    amount = _scalar("SELECT amount_minor FROM payment_events WHERE id = :id", id=event_id)
    assert _scalar("SELECT paid_minor FROM orders WHERE id = :id", id=order_id) == 0
    broker_redis.delete(QUEUE)
    stale = set(broker_redis.hkeys(UNACKED))
    worker = worker_process("crash", QUEUE, 1, include=INCLUDE)

    job = support_crash.apply_then_crash.delay(event_id=event_id)
    wait_for(lambda: app.AsyncResult(job.id).state == "SUCCESS", timeout=90, every=0.2)

    # the body ran twice: the ledger could not know that the first run had committed
    assert store_redis.get(support_crash.CRASH_RUNS + event_id) == "2"
    assert store_redis.get(support_crash.FIRST_DELIVERY + event_id) == job.id
    assert worker.output().count(LOST_RUNNING_JOB) == 1
    ledger = RedisStore(store_redis).key_state(
        f"testing.apply_then_crash:crash-after-commit:{event_id}"
    )
    assert ledger.ledger_state == "done"
    # ... and the effect happened once
    assert app.AsyncResult(job.id).result == "already applied"
    assert _scalar("SELECT paid_minor FROM orders WHERE id = :id", id=order_id) == amount
    assert (
        _scalar(
            "SELECT count(*) FROM cc_processed_jobs WHERE key = :key",
            key=f"crash-after-commit:{event_id}",
        )
        == 1
    )
    assert (
        _scalar(
            "SELECT count(*) FROM payment_events WHERE id = :id AND applied_at IS NOT NULL",
            id=event_id,
        )
        == 1
    )
    wait_for(lambda: _nothing_left(broker_redis, store_redis, stale), timeout=30)


# -- 4. a redelivery after the visibility timeout, while the first run goes on ----------


def test_a_visibility_timeout_redelivery_does_not_run_the_body_twice(
    worker_process: Callable[..., WorkerProcess],
    broker_redis: redis.Redis,
    store_redis: redis.Redis,
) -> None:
    _seed()
    event_id = _event_id(SLOW_EVENT_NUMBER)
    order_id = _order_id(SLOW_EVENT_NUMBER)
    amount = _scalar("SELECT amount_minor FROM payment_events WHERE id = :id", id=event_id)
    assert _scalar("SELECT paid_minor FROM orders WHERE id = :id", id=order_id) == 0
    broker_redis.delete(QUEUE)
    stale = set(broker_redis.hkeys(UNACKED))
    short = {"CONVENTIONS_VISIBILITY_TIMEOUT": str(SLOW_VISIBILITY)}
    first = worker_process("slow1", QUEUE, 2, include=INCLUDE, **short)

    job = support_crash.slow_apply.delay(event_id=event_id)
    wait_for(lambda: store_redis.get(support_crash.SLOW_RUNS + event_id) == "1", timeout=30)

    # the running job's message stays unacked past the visibility timeout...
    def delivered_long_ago() -> bool:
        mine = set(broker_redis.hkeys(UNACKED)) - stale
        times = [broker_redis.zscore(UNACKED_INDEX, tag) or time.time() for tag in mine]
        return bool(times) and time.time() - max(times) > SLOW_VISIBILITY + 0.5

    wait_for(delivered_long_ago, timeout=30, every=0.2)
    # ... so the next worker's first sweep puts it back while the first run goes on.
    # kombu sweeps under a mutex that a worker killed mid-sweep (earlier tests kill -9
    # workers) leaves held for up to 5 minutes: clear it so the sweep is not skipped.
    broker_redis.delete(UNACKED_MUTEX)
    second = worker_process("slow2", QUEUE, 2, include=INCLUDE, **short)
    workers = [first, second]
    wait_for(lambda: _count(workers, DEFERRED) >= 1, timeout=30, every=0.2)
    assert store_redis.get(support_crash.SLOW_RUNS + event_id) == "1"
    store_redis.set(support_crash.RELEASE + event_id, "1")
    wait_for(lambda: _count(workers, SKIPPED) >= 1, timeout=60, every=0.2)
    wait_for(lambda: _nothing_left(broker_redis, store_redis, stale), timeout=30)

    # the redelivery was deferred while the first run held the key, then skipped: the
    # body ran once and the payment was applied once
    assert store_redis.get(support_crash.SLOW_RUNS + event_id) == "1"
    ledger = RedisStore(store_redis).key_state(f"testing.slow_apply:slow-apply:{event_id}")
    assert ledger.ledger_state == "done"
    assert _scalar("SELECT paid_minor FROM orders WHERE id = :id", id=order_id) == amount
    assert (
        _scalar(
            "SELECT count(*) FROM cc_processed_jobs WHERE key = :key",
            key=f"slow-apply:{event_id}",
        )
        == 1
    )
    assert app.AsyncResult(job.id).state == "SUCCESS"
    print(f"\nvisibility: result of {job.id} after the skipped redelivery: {job.result!r}")
