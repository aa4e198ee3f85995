"""Queue state from the broker: the oldest job's age, consumers, and the reader's cost.

Real Redis, real ``celery`` worker subprocesses and a real exporter subprocess scraped
over HTTP.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from conventions.observability import queues
from conventions.ops import transport_view
from conventions.transport import layout
from tasks import app
from tests.integration import support_metrics
from tests.integration.exporter import ExporterProcess
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

METERED = "testing.metered.v1"
#: how long the queue waits with no worker (the issue's scenario: about 30 s)
STALE_FOR = 30.0


@pytest.fixture(scope="module")
def exporter(services: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExporterProcess]:
    log = tmp_path_factory.mktemp("exporter") / "exporter.log"
    with ExporterProcess("tests.integration.support_metrics:app", log) as process:
        yield process


def _empty_queues(client: redis.Redis) -> None:
    with queues.from_app(app) as reader:
        client.delete(*[key for queue in reader.queues for key in reader.lists(queue)])


# 35 s of a real queue ageing: in make chaos (make test's 20 minutes)
@pytest.mark.chaos
def test_with_no_worker_the_oldest_age_grows_and_a_worker_drains_it_to_zero(
    exporter: ExporterProcess,
    broker_redis: redis.Redis,
    worker_process: Callable[..., Any],
) -> None:
    _empty_queues(broker_redis)
    first = time.time()
    for n in range(100):
        support_metrics.metered.delay(item_id=f"age_{n}")
    time.sleep(STALE_FOR)
    scrape = exporter.scrape()
    elapsed = time.time() - first
    age = scrape["celery_conventions_queue_oldest_age_seconds", "email", ""]
    assert scrape["celery_conventions_queue_depth", "email", ""] == 100
    assert elapsed - 5 <= age <= elapsed + 1, (age, elapsed)  # about 30 s
    assert scrape["celery_conventions_queue_consumers", "email", ""] == 0
    assert scrape["celery_conventions_queue_oldest_age_seconds", "heavy", ""] == 0
    assert scrape["celery_conventions_queue_delayed", "email", ""] == 0
    assert scrape["celery_conventions_queue_in_flight", "email", ""] == 0

    worker_process("drain", "email", concurrency=2, include="tests.integration.support_metrics")

    def drained() -> bool:
        now = exporter.scrape()
        return (
            now["celery_conventions_queue_depth", "email", ""] == 0
            and now["celery_conventions_queue_oldest_age_seconds", "email", ""] == 0
            and now["celery_conventions_queue_consumers", "email", ""] == 1
            # the worker's sign of life, written by the layer's transport itself
            and now["celery_conventions_queue_consumers_alive", "email", ""] == 1
            and now["celery_conventions_queue_in_flight", "email", ""] == 0
        )

    wait_for(drained, timeout=120, every=0.5)
    done = exporter.scrape()["celery_conventions_jobs_succeeded_total", "email", METERED]
    assert done == 100


def test_the_queues_view_prints_depth_age_and_consumers(
    broker_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    from conventions.cli import main as cli

    _empty_queues(broker_redis)
    for n in range(3):
        support_metrics.metered.delay(item_id=f"view_{n}")
    assert cli.main(["-A", "tests.integration.support_metrics:app", "queues", "--json"]) == 0
    rows = {row["queue"]: row for row in json.loads(capsys.readouterr().out)}
    assert (rows["email"]["depth"], rows["email"]["consumers"]) == (3, 0)
    assert rows["email"]["age_source"] == "header" and rows["email"]["oldest_age"] >= 0
    assert rows["heavy"]["age_source"] == "empty"
    held = ("delayed", "next_due_in", "in_flight", "in_inboxes", "consumers_alive")
    assert [rows["email"][name] for name in held] == [0, None, 0, 0, 0]
    assert cli.main(["-A", "tests.integration.support_metrics:app", "queues", "--watch",
                     "--count", "2", "--interval", "0.2"]) == 0  # fmt: skip
    frames = capsys.readouterr().out.split("QUEUE")
    assert len(frames) == 3  # two tables
    email = next(line for line in frames[2].splitlines() if line.startswith("email"))
    (_, depth, oldest, slo, delayed, due, flight, inboxes, consumers, alive, in_rate, out_rate,
     paused) = email.split()  # fmt: skip
    assert paused == "-"
    assert (depth, slo, consumers) == ("3", "120s", "0")  # celeryconfig's email SLO
    assert (delayed, due, flight, inboxes, alive) == ("0", "-", "0", "0", "0")
    assert oldest.endswith("s") and float(oldest[:-1]) >= 0
    assert (in_rate, out_rate) == ("0.0", "0.0")  # the second frame has rates
    _empty_queues(broker_redis)


def test_a_message_without_our_header_reports_how_long_it_was_seen_at_the_head(
    broker_redis: redis.Redis,
) -> None:
    _empty_queues(broker_redis)
    foreign = {"body": "", "headers": {"task": "x"}, "properties": {"delivery_tag": "tag-1"}}
    broker_redis.lpush("heavy", json.dumps(foreign))
    with queues.from_app(app) as reader:
        first = {s.queue: s for s in reader.read()}["heavy"]
        assert (first.depth, first.oldest_age, first.age_source) == (1, None, "unknown")
        time.sleep(1.1)
        later = {s.queue: s for s in reader.read()}["heavy"]
    assert later.age_source == "seen"
    assert later.oldest_age is not None and later.oldest_age >= 1.0
    _empty_queues(broker_redis)


INBOX_PREFIX = layout.INBOX.split("{", 1)[0]
CONSUMER_PREFIX = layout.CONSUMER.split("{", 1)[0]


def _name(args: Any) -> str:
    """A command's name; an LLEN of a consumer's inbox as ``LLEN inbox`` and an HMGET of
    a live consumer's description as ``HMGET consumer``: how many inboxes and consumers
    are registered depends on the fleet of the moment (the workers of this file, and of
    the files this test worker ran before, until their liveness runs out), not on a
    queue's depth."""
    name = str(args[0]).upper()
    key = args[1] if len(args) > 1 else b""
    key = key.decode() if isinstance(key, bytes) else str(key)
    if name == "LLEN" and key.startswith(INBOX_PREFIX):
        return "LLEN inbox"
    return "HMGET consumer" if name == "HMGET" and key.startswith(CONSUMER_PREFIX) else name


class CountingConnection(redis.Connection):
    """Records the name of every command sent to Redis."""

    sent: list[str] = []

    def pack_command(self, *args: Any) -> Any:
        self.sent.append(_name(args))
        return super().pack_command(*args)

    def pack_commands(self, commands: Any) -> Any:
        commands = list(commands)
        self.sent.extend(_name(command) for command in commands)
        return super().pack_commands(commands)


def _per_depth(sent: list[str]) -> list[str]:
    """The commands of a read that could grow with a queue's depth: the inboxes' LLENs
    and the live consumers' HMGETs (one per registered inbox or consumer, whatever the
    depths) left out."""
    return [name for name in sent if name not in {"LLEN inbox", "HMGET consumer"}]


def _commands_of_one_read(
    tmp_path: Path, held: bool = False
) -> tuple[list[str], list[queues.QueueState]]:
    """The commands one read sends: the lists only, or (``held``) what the layer's
    transport holds too."""
    pool = redis.ConnectionPool.from_url(
        str(app.conf.broker_url), connection_class=CountingConnection
    )
    client = redis.Redis(connection_pool=pool)
    try:
        client.ping()
        CountingConnection.sent.clear()
        reader = transport_view.broker_reader(app, client) if held else queues.from_app(app, client)
        states = reader.read()
        return list(CountingConnection.sent), states
    finally:
        client.close()
        pool.disconnect()


def test_reading_a_queue_of_100000_jobs_sends_as_few_commands_as_reading_one(
    broker_redis: redis.Redis, tmp_path: Path
) -> None:
    _empty_queues(broker_redis)
    support_metrics.metered.delay(item_id="cost_first")
    few, states = _commands_of_one_read(tmp_path)
    assert {s.queue: s.depth for s in states}["email"] == 1
    message = broker_redis.lindex("email", -1)
    with broker_redis.pipeline(transaction=False) as pipe:
        for _ in range(99_999):
            pipe.lpush("email", message)  # newer copies in front of the oldest one
        pipe.execute()
    started = time.perf_counter()
    many, states = _commands_of_one_read(tmp_path)
    took = time.perf_counter() - started
    email = {s.queue: s for s in states}["email"]
    assert email.depth == 100_000 and email.age_source == "header"
    assert _per_depth(many) == _per_depth(few)  # the same commands, whatever the depth
    with queues.from_app(app) as reader:
        pass  # its queue names and priority lists only
    per_queue = 2 * len(reader.priority_steps)  # LLEN + LINDEX -1 per priority list
    assert len(many) == per_queue * len(reader.queues)
    assert set(many) == {"LLEN", "LINDEX"}  # both O(1) at index -1: nothing scans
    print(f"one read of {email.depth} waiting jobs: {len(many)} commands, {took * 1000:.1f} ms")
    _empty_queues(broker_redis)


def test_reading_100000_delayed_jobs_sends_as_few_commands_as_reading_one(
    broker_redis: redis.Redis, tmp_path: Path
) -> None:
    _empty_queues(broker_redis)
    key = layout.DELAYED.format(queue="email")
    broker_redis.delete(key)
    due = time.time() + 7200
    broker_redis.zadd(key, {"email\n{}": due})
    few, states = _commands_of_one_read(tmp_path, held=True)
    assert {s.queue: s.delayed for s in states}["email"] == 1
    with broker_redis.pipeline(transaction=False) as pipe:
        for n in range(99_999):
            pipe.zadd(key, {f'email\n{{"n": {n}}}': due + n})
        pipe.execute()
    many, states = _commands_of_one_read(tmp_path, held=True)
    email = {s.queue: s for s in states}["email"]
    assert email.delayed == 100_000
    assert email.next_due_in is not None and 7100 < email.next_due_in <= 7200
    assert _per_depth(many) == _per_depth(few)  # whatever the size of the delayed set
    assert {"ZCARD", "ZRANGE"} <= set(many)
    print(f"one read with {email.delayed} delayed jobs: {len(many)} commands")
    broker_redis.delete(key)
