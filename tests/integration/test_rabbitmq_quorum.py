"""The reliable profile on a real RabbitMQ: quorum queues, the poison queue, publisher
confirms with mandatory routing, and delays kept by the broker.

The app (:mod:`tests.integration.support_rabbit_quorum`) has ``q26_``-prefixed queues,
deleted before and after the module (``TEST_AMQP_URL``'s vhost; CI's is ``/``, where the
demo's ``email`` and ``heavy`` are left alone). Celery's ``celery_delayed_*`` topology is
shared by the vhost and kept; a test takes its own message back out of it.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from kombu import Connection, Queue

from conventions.errors import Unroutable
from conventions.ops import replay as replaylib
from conventions.store import batches as b
from conventions.store.records import Category, DeadLetter
from conventions.tracing import headers as hdr
from conventions.transport import amqp_queues
from conventions.worker import poison_queue
from tests.fixtures import unavailable
from tests.integration import support_rabbit_quorum as q
from tests.integration.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.support_rabbit_quorum:app"
DELAY_QUEUES = [f"celery_delayed_{level}" for level in range(28)]


def _connection() -> Connection:
    return Connection(q.AMQP_URL, connect_timeout=5)


def _clean() -> None:
    with _connection() as connection:
        channel = connection.channel()
        for name in q.QUEUES:
            channel.queue_delete(name)
            channel.exchange_delete(name)
        channel.close()
    q.app.__dict__.pop("_cc_amqp_topology", None)


@pytest.fixture(scope="module")
def broker(services: None) -> Iterator[None]:
    try:
        with _connection() as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        unavailable("RabbitMQ", exc)
    _clean()
    yield
    _clean()


def _declared(name: str) -> tuple[int, int] | None:
    with _connection() as connection:
        try:
            found = connection.channel().queue_declare(name, passive=True)
        except amqp.exceptions.NotFound:
            return None
        return int(found.message_count), int(found.consumer_count)


class Worker:
    """A real ``celery worker`` subprocess of the quorum app."""

    def __init__(self, name: str, queue: str, log: Path) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, "worker", "-Q", queue, "-c", "1",
             "-P", "prefork", "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "--without-gossip",
             "--without-mingle", "--loglevel=INFO"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=self._out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.read_bytes().count(b" ready.") > self.readies:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.log.read_text(errors='replace')}")
            time.sleep(0.1)
        raise TimeoutError(self.log.read_text(errors="replace"))

    readies = 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def _start(name: str, queue: str, log: Path) -> Worker:
    readies = log.read_bytes().count(b" ready.") if log.exists() else 0
    worker = Worker(name, queue, log)
    worker.readies = readies
    worker.wait_ready()
    return worker


@pytest.fixture(scope="module")
def worker(broker: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    started = _start("q26", q.JOBS, tmp_path_factory.mktemp("q26") / "worker.log")
    yield started
    started.stop()


def _times(kind: str, item: str) -> list[float]:
    """When the jobs of ``kind`` (``ran``, ``pill``) for ``item`` ran (``time.time()``)."""
    client = q.effects()
    try:
        return [float(x) for x in client.lrange(f"{q.PREFIX}:{kind}:{item}", 0, -1)]
    finally:
        client.close()


def _ran(item: str) -> list[float]:
    return _times("ran", item)


# -- the queues --------------------------------------------------------------------------


def test_every_workload_queue_is_quorum_with_a_delivery_limit_and_the_poison_queue(
    broker: None,
) -> None:
    expected = {
        "x-queue-type": "quorum",
        "x-delivery-limit": q.LIMIT,
        "x-dead-letter-exchange": q.POISON,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    queues = {queue.name: queue for queue in q.app.amqp.queues.values()}
    assert set(queues) == {q.JOBS, q.SIDE, q.PILLS, q.DEFAULT}
    for queue in queues.values():
        assert queue.queue_arguments == expected and queue.exchange.type == "topic"
    amqp_queues.ensure(q.app)  # what the first publish does
    with _connection() as connection:
        # the broker has them with these arguments: an equal declaration passes ...
        Queue(q.JOBS, queues[q.JOBS].exchange, routing_key=q.JOBS,
              queue_arguments=expected)(connection.channel()).declare()  # fmt: skip
        # ... and a classic one of the same name is refused (see docs: migrating)
        with pytest.raises(amqp.exceptions.PreconditionFailed):
            connection.channel().queue_declare(q.JOBS, durable=True)
    assert _declared(q.POISON) is not None


def test_an_unroutable_publish_raises_unroutable_and_leaves_the_key_free(broker: None) -> None:
    item = f"u{uuid.uuid4().hex[:8]}"
    with pytest.raises(Unroutable, match="routed the message nowhere") as caught:
        q.sided.apply_async(kwargs={"item_id": item}, routing_key="q26_bound_to_nothing")
    assert "\n" not in str(caught.value)
    # nothing was published, and the idempotency key was given back: it publishes now
    result = q.sided.delay(item_id=item)
    assert result.deduplicated is False
    assert _declared(q.SIDE) == (1, 0)
    _take(q.SIDE, count=1)


def _take(name: str, count: int) -> list[Any]:
    """Take ``count`` messages out of a queue (acked)."""
    taken = []
    with _connection() as connection:
        channel = connection.channel()
        for _ in range(count):
            message = channel.basic_get(name, no_ack=True)
            assert message is not None
            taken.append(message)
    return taken


def test_a_classic_queue_in_the_way_is_one_configuration_error_naming_the_migration(
    broker: None,
) -> None:
    from conventions import App
    from conventions.config.profile import reliable
    from conventions.errors import ConfigurationError

    clash = "q26_clash"
    with _connection() as connection:
        connection.channel().queue_declare(clash, durable=True)  # a classic one, left over
    app = App("q26_clash", set_as_current=False)
    app.conf.update(
        reliable(broker_url=q.AMQP_URL, store_url=q.STORE_URL),
        conventions_workloads={"quorum": clash}, task_default_queue=clash,
        conventions_poison_queue=q.POISON,
    )  # fmt: skip
    try:
        job = app.job("testing.q26_clash.v1", payload=q.Item, key="q26c:{item_id}",
                      workload="quorum")(q.ran.run)  # fmt: skip
        with pytest.raises(ConfigurationError, match="migrating from classic queues") as caught:
            job.delay(item_id="c1")
        assert "inequivalent arg" in str(caught.value) and "\n" not in str(caught.value)
    finally:
        _close_store(app)
        with _connection() as connection:
            connection.channel().queue_delete(clash)
            connection.channel().exchange_delete(clash)


def _close_store(app: Any) -> None:
    """Close the store an app of a test's own opened (its sockets are not left to GC)."""
    store = app.__dict__.pop("_cc_store", None)
    if store is not None:
        store.close()


# -- the poison queue --------------------------------------------------------------------


def _past_the_delivery_limit(item: str, headers: dict[str, str] | None = None) -> str:
    """Publish a side job and give it back to RabbitMQ until it dead-letters it at its
    delivery limit (what a worker killed each time does): its task id."""
    result = q.sided.apply_async(kwargs={"item_id": item}, headers=headers)
    with _connection() as connection:
        channel = connection.channel()
        for _ in range(q.LIMIT + 1):  # delivered LIMIT + 1 times, then dead-lettered
            deadline = time.monotonic() + 5
            message = None
            while message is None and time.monotonic() < deadline:
                message = channel.basic_get(q.SIDE, no_ack=False)
            assert message is not None
            channel.basic_reject(message.delivery_tag, requeue=True)
    deadline = time.monotonic() + 5
    while (_declared(q.POISON) or (0, 0))[0] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _declared(q.SIDE) == (0, 0)
    return str(result.id)


def _record(task_id: str) -> DeadLetter | None:
    found = [r for r in q.app.store.list_dead_letters(limit=50) if r.task_id == task_id]
    return found[0] if found else None


def test_a_message_past_its_delivery_limit_becomes_a_poison_record_that_replays(
    broker: None,
) -> None:
    task_id = _past_the_delivery_limit(f"p{uuid.uuid4().hex[:8]}")
    assert _declared(q.POISON) == (1, 0)
    assert poison_queue.drain(q.app, worker="test") == (1, 0)
    assert _declared(q.POISON) == (0, 0)  # acked once written
    record = _record(task_id)
    assert record is not None
    assert record.category is Category.POISON and record.task == q.sided.name
    assert record.payload["item_id"].startswith("p") and record.queue == q.SIDE
    assert record.correlation_id and record.idempotency_key
    assert "delivery_limit" in record.message and f"x-delivery-limit {q.LIMIT}" in record.message
    assert record.attempts == q.LIMIT + 1
    assert q.app.AsyncResult(task_id).state == "FAILURE"  # a caller waiting gets an answer
    # replay publishes the job again, on its own queue
    replayed = replaylib.replay(q.app, record.id, reason="test", actor="test")
    assert replayed.deduplicated is False
    assert _declared(q.SIDE) == (1, 0)
    _take(q.SIDE, count=1)


def test_a_batch_member_past_its_delivery_limit_ends_failed_in_its_batch(broker: None) -> None:
    """RabbitMQ dead-letters a member no worker could ack (killed each time): its poison
    record ends it in its batch in the same step, so the batch ends (else its callback
    would never run), and the record names it as the batch's dead letter."""
    item, batch_id = f"p{uuid.uuid4().hex[:8]}", f"poison-batch-{uuid.uuid4().hex[:8]}"
    member = q.sided.prepare({"item_id": item}, {})[1]  # its namespaced key
    spec = b.BatchSpec(batch_id, (member,))
    assert q.app.store.create_batch(spec)
    task_id = _past_the_delivery_limit(item, {hdr.BATCH: batch_id})
    assert poison_queue.drain(q.app, worker="test") == (1, 0)
    record = _record(task_id)
    assert record is not None and record.category is Category.POISON
    status = q.app.store.get_batch(batch_id)
    assert status is not None and (status.pending, status.failed) == (0, 1)
    assert status.dead_letter_ids == [record.id] and status.ended_at is not None


class Tripwire:
    """Unpickling this writes a file: what a pickle body could run in the consumer."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (Path.write_text, (Path(self.path), "unpickled"))


def test_a_pickle_in_the_poison_queue_is_kept_raw_never_unpickled(
    broker: None, tmp_path: Path
) -> None:
    """Anyone who can publish to a workload queue can get a message dead-lettered into the
    poison queue: its consumer decodes only what the app accepts (JSON)."""
    import pickle

    tripwire = tmp_path / "tripwire"
    body = pickle.dumps(Tripwire(str(tripwire)))
    task_id = f"pk{uuid.uuid4().hex[:8]}"
    with _connection() as connection:
        producer = connection.Producer()
        producer.publish(
            body, exchange=q.POISON, routing_key=q.POISON, serializer=None,
            content_type="application/x-python-serialize", content_encoding="binary",
            headers={"id": task_id, "task": q.sided.name,
                     "x-death": [{"reason": "delivery_limit", "queue": q.SIDE, "count": 1}]},
        )  # fmt: skip
    assert poison_queue.drain(q.app, worker="test") == (1, 0)
    record = _record(task_id)
    assert record is not None and record.category is Category.POISON
    assert record.payload["content_type"] == "application/x-python-serialize"
    assert not tripwire.exists()


def test_a_body_over_the_cap_in_the_poison_queue_is_kept_as_its_head_never_decoded(
    broker: None,
) -> None:
    task_id = f"big{uuid.uuid4().hex[:8]}"
    body = json.dumps([[], {"blob": "x" * (2 * 1024 * 1024)}, {}])
    # confirmed: closed at once, the connection would drop a publish this large
    with Connection(q.AMQP_URL, transport_options={"confirm_publish": True}) as connection:
        amqp_queues.poison_queue(q.app.conf)(connection.channel()).declare()
        connection.Producer().publish(
            body, exchange=q.POISON, routing_key=q.POISON, serializer=None,
            content_type="application/json", content_encoding="utf-8",
            headers={"id": task_id, "task": q.sided.name,
                     "x-death": [{"reason": "delivery_limit", "queue": q.SIDE, "count": 1}]},
        )  # fmt: skip
    assert poison_queue.drain(q.app, worker="test") == (1, 0)
    record = _record(task_id)
    assert record is not None and record.payload["size"] == len(body)
    assert record.payload["truncated"] is True and "blob" not in record.payload


def test_with_the_store_down_the_poison_message_is_not_acked(
    broker: None, caplog: pytest.LogCaptureFixture
) -> None:
    task_id = _past_the_delivery_limit(f"d{uuid.uuid4().hex[:8]}")
    down = type(q.app)("q26_store_down", set_as_current=False)
    down.conf.update({**q.app.conf, "conventions_store_url": "redis://127.0.0.1:1/0",
                      "conventions_publish_timeout": 1.0})  # fmt: skip
    assert poison_queue.drain(down, worker="test") == (0, 1)
    assert _declared(q.POISON) == (1, 0)  # given back, not lost
    # the worker's consumer holds it, unacked, while the store stays down ...
    consumer = poison_queue.PoisonQueueConsumer(down, "test")
    consumer.start()
    tried = f"poison queue: cannot record {task_id} yet"
    with caplog.at_level(logging.WARNING, logger=poison_queue.__name__):
        wait_for(lambda: caplog.text.count(tried) >= 2, timeout=20)  # it took it, tried twice
    assert _declared(q.POISON) == (0, 1) and consumer.acked == 0
    consumer.stop(timeout=15)
    assert not consumer.is_alive()
    assert _declared(q.POISON) == (1, 0)  # ... and gives it back when it stops
    assert _record(task_id) is None
    _close_store(down)
    assert poison_queue.drain(q.app, worker="test") == (1, 0)  # the store is back
    assert _record(task_id) is not None


def test_the_cli_records_the_poison_queue_in_the_foreground(
    broker: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from conventions.cli import main as cli

    task_id = _past_the_delivery_limit(f"l{uuid.uuid4().hex[:8]}")
    assert cli.main(["-A", APP, "dlq", "poison", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"queue": q.POISON, "acked": 1, "left": 0}
    # the CLI drops the app's result backends (``cli.backends.bounded``) without closing
    # them: collected here, not in a later test where the warning would fail it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    record = _record(task_id)
    assert record is not None and record.worker == "cli"


# -- delays ------------------------------------------------------------------------------


def _in_delay_queues() -> int:
    with _connection() as connection:
        channel = connection.channel()
        total = 0
        for name in DELAY_QUEUES:
            try:
                total += int(channel.queue_declare(name, passive=True).message_count)
            except amqp.exceptions.NotFound:
                channel = connection.channel()
        return total


def test_a_countdown_waits_in_the_broker_and_runs_once_on_time(worker: Worker) -> None:
    item = f"c{uuid.uuid4().hex[:8]}"
    before = _in_delay_queues()
    sent = time.time()
    q.ran.apply_async(kwargs={"item_id": item}, countdown=3)
    wait_for(lambda: _in_delay_queues() == before + 1, timeout=5)  # in the delay queues ...
    scheduled = q.app.control.inspect(timeout=1.0).scheduled() or {}
    assert all(not jobs for jobs in scheduled.values())  # ... not in the worker's memory
    wait_for(lambda: _ran(item), timeout=15)
    # a second copy would be in the queue before this probe, or still in the delay queues
    probe = f"p{uuid.uuid4().hex[:8]}"
    q.ran.delay(item_id=probe)
    wait_for(lambda: _ran(probe), timeout=15)  # the worker (one slot) took all before it
    assert _in_delay_queues() == before
    runs = _ran(item)
    assert len(runs) == 1
    assert 3.0 <= runs[0] - sent < 6.0  # not early; late by the delay queues' hops


def test_a_two_hour_countdown_sits_in_the_broker(worker: Worker) -> None:
    item = f"h{uuid.uuid4().hex[:8]}"
    before = _in_delay_queues()
    result = q.ran.apply_async(kwargs={"item_id": item}, countdown=7200)
    wait_for(lambda: _in_delay_queues() == before + 1, timeout=5)
    scheduled = q.app.control.inspect(timeout=1.0).scheduled() or {}
    assert all(not jobs for jobs in scheduled.values())
    assert _take_delayed(str(result.id))


def _take_delayed(task_id: str) -> bool:
    """Take one message of ours out of the delay queues (others are given back)."""
    with _connection() as connection:
        channel = connection.channel()
        for name in DELAY_QUEUES:
            try:
                count = int(channel.queue_declare(name, passive=True).message_count)
            except amqp.exceptions.NotFound:
                channel = connection.channel()
                continue
            for _ in range(count):
                message = channel.basic_get(name, no_ack=False)
                if message is None:
                    break
                if message.headers.get("id") == task_id:
                    channel.basic_ack(message.delivery_tag)
                    channel.close()  # every other one taken goes back
                    return True
            channel.close()
            channel = connection.channel()
    return False


# -- the worker's poison consumer and the doctor ----------------------------------------


def test_a_workers_poison_consumer_records_a_dead_lettered_message(worker: Worker) -> None:
    task_id = _past_the_delivery_limit(f"w{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + 10
    record = None
    while record is None and time.monotonic() < deadline:
        record = _record(task_id)
        time.sleep(0.1)
    assert record is not None and record.category is Category.POISON
    assert record.worker.startswith("q26-")  # the worker's, not a drain's
    assert _declared(q.POISON) == (0, 1)  # acked; its one consumer is the worker's


def test_the_live_doctor_says_which_queues_rabbitmq_counts_no_consumer_on(
    worker: Worker,
) -> None:
    from conventions.ops import doctor_live

    live = doctor_live.observe(q.app, timeout=2.0)
    assert live.broker_consumers[q.JOBS] == 1 and live.broker_consumers[q.POISON] == 1
    found = {(f.code, f.subject) for f in doctor_live.live_checks(q.app, live)}
    assert ("rabbitmq-no-consumer", q.SIDE) in found
    assert ("rabbitmq-no-consumer", q.PILLS) in found
    assert ("rabbitmq-no-consumer", q.JOBS) not in found
    assert not {code for code, _ in found if code == "poison-queue-unconsumed"}


# -- the crash pill ----------------------------------------------------------------------


@pytest.mark.chaos
def test_a_pill_that_kills_its_worker_becomes_poison_after_the_delivery_limit(
    broker: None, tmp_path: Path
) -> None:
    """Each delivery kills the whole worker (never acked); a new worker is started after
    each death, once the dead run's lease lapsed (else the layer defers the delivery,
    publishing it anew, and RabbitMQ's count starts again: the layer's claims count on).
    RabbitMQ dead-letters the pill at its delivery limit, before the layer's own
    quarantine (set far away here), and a worker's poison-queue consumer records it."""
    item = f"k{uuid.uuid4().hex[:8]}"
    log = tmp_path / "pills.log"
    result = q.pill.delay(item_id=item)
    deaths = 0
    started = time.monotonic()
    record: DeadLetter | None = None
    while time.monotonic() - started < 120:
        pills = _start("q26pill", q.PILLS, log)
        deadline = time.monotonic() + 20
        while pills.proc.poll() is None and time.monotonic() < deadline:
            record = _record(str(result.id))
            if record is not None:
                break
            time.sleep(0.2)
        if record is not None:
            pills.stop()
            break
        deaths += 1 if pills.proc.poll() is not None else 0
        pills.stop()
        time.sleep(1.2)  # the dead run's lease (1 s) lapses: the next delivery claims
    runs = _times("pill", item)
    assert record is not None, log.read_text(errors="replace")
    took = record.last_failed_at.timestamp() - runs[0]
    print(f"pill: {len(runs)} deliveries, {deaths} worker deaths, record {took:.1f}s after "
          "the first delivery")  # fmt: skip
    assert len(runs) == q.LIMIT + 1 and record.category is Category.POISON
    assert _declared(q.PILLS) == (0, 0)


def test_a_broker_that_is_down_is_backend_unavailable_at_once(services: None) -> None:
    from conventions import App
    from conventions.config.profile import reliable
    from conventions.errors import BackendUnavailable

    down = App("q26_down", set_as_current=False)
    down.conf.update(
        reliable(broker_url="amqp://guest:guest@127.0.0.1:1//", store_url=q.STORE_URL),
        conventions_workloads={"quorum": q.JOBS}, task_default_queue=q.DEFAULT,
    )  # fmt: skip
    job = down.job("testing.q26_down.v1", payload=q.Item, key="q26d:{item_id}",
                   workload="quorum")(q.ran.run)  # fmt: skip
    started = time.monotonic()
    try:
        with pytest.raises(BackendUnavailable, match="the broker is unavailable"):
            job.delay(item_id="d1")
        assert time.monotonic() - started < 5  # refused connections fail fast
    finally:
        _close_store(down)
