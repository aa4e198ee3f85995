"""`make demo` stays true: it runs to the end on the embedded default and on Redis, its
summary's numbers match the shop database, the store and the SMTP sink's log, and it
leaves no process running, even when it is interrupted.

The demo wipes ``.demo/`` of the checkout; it runs on Redis databases ``DEMO_REDIS_DBS``
(default 3 and 4), emptied first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from conventions.store import open_store
from tasks import shop
from tests.fixtures import unavailable
from tests.integration import support_cluster
from tests.isolation import fixed

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".demo"
#: what the scenario does (demo/story.py): 12 events, 4 of them three times, 8 twice,
#: and evt_0001 once more after it was applied
DUPLICATES = 4 * 2 + 8 * 1 + 1
RECEIPTS = 6 + 12  # the web orders and the paid webhook events
FLAKY = 4
#: the variables the test suite sets for itself; the demo chooses on its own
SUITE_ONLY = (
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "CONVENTIONS_STORE_URL",
    "DATABASE_URL",
    "CELERY_RESULT_BACKEND",
    "CONVENTIONS_LEASE_SECONDS",
    "CONVENTIONS_DOCTOR_LEVELS",
)


def demo_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SUITE_ONLY}


def run_demo(*args: str, **env: str) -> tuple[str, dict[str, Any]]:
    """Run the demo to its end; on a timeout, SIGTERM it first so that it stops what it
    started (a SIGKILL would leave its processes behind). ``env``: variables the demo
    gets beside the environment (a broker of the test's choice)."""
    with subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), *args],
        cwd=ROOT, env={**demo_env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    ) as demo:  # fmt: skip
        try:
            said = demo.communicate(timeout=200)[0]
        except subprocess.TimeoutExpired:
            demo.terminate()
            said = demo.communicate(timeout=60)[0]
            raise AssertionError(f"the demo took too long:\n{said[-6000:]}") from None
    assert demo.returncode == 0, said[-8000:]
    return said, json.loads((DATA / "summary.json").read_text())


def processes_of(run_id: str) -> list[int]:
    """Every live process started by the demo run ``run_id`` (its environment says so)."""
    marker = f"DEMO_RUN_ID={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def assert_numbers_are_true(s: dict[str, Any]) -> None:
    """The summary against the shop database, the store and the SMTP sink's log."""
    assert all(s["checks"].values()), s["checks"]
    assert s["duplicates"]["sent"] == DUPLICATES == s["duplicates"]["absorbed"]
    # the late re-delivery at least; a burst duplicate whose twin had already finished
    # (its ``until_done`` reservation released) is the ledger's too: that is timing
    assert s["duplicates"]["absorbed_by_ledger"] >= 1
    engine = shop.make_engine(s["database_url"])
    store = open_store(s["store_url"])
    try:
        with engine.connect() as conn:
            paid = conn.scalar(select(func.count()).where(shop.Order.status == shop.PAID))
            twice = conn.scalar(
                select(func.count()).where(
                    shop.Order.paid_minor != shop.Order.amount_minor, shop.Order.status == shop.PAID
                )
            )
            receipts = list(conn.scalars(select(shop.SentEmail.message_id)))
            today = conn.execute(
                select(shop.DailyReport).where(
                    shop.DailyReport.business_date == s["report"]["occurrence"]
                )
            ).one()
        assert paid == RECEIPTS == len(receipts) == s["shop"]["receipts"]
        assert twice == 0
        assert today.orders == s["shop"]["orders_today"] == s["report"]["result"]["orders"]

        log = [json.loads(x) for x in (DATA / "mail" / "log.jsonl").read_text().splitlines()]
        replies = Counter(line["reply"] for line in log)
        accepted = [line["message_id"] for line in log if line["reply"] == 250]
        assert sorted(accepted) == sorted(receipts)  # each receipt reached the sink once
        assert (replies[451], replies[550]) == (FLAKY, 1)

        counters = store.counters()
        receipt, payment = "email.send_receipt.v2", "payments.apply_event.v1"
        assert counters.get(("retried", receipt)) == FLAKY == len(s["retries"])
        # jittered under the receipt task's backoff ceiling (1 s, doubled per attempt)
        assert all(0 <= r["delay"] <= 2 ** (r["attempt"] - 1) for r in s["retries"])
        absorbed = counters.get(("deduplicated", payment), 0)
        absorbed += counters.get(("skipped_duplicate", payment), 0)
        assert absorbed == DUPLICATES

        records = store.list_dead_letters(limit=100)
        categories = Counter(str(r.category) for r in records)
        assert categories == Counter(s["dead_letters"]["by_category"])
        assert categories == Counter({"permanent": 2, "unparseable": 1})
        dead_receipt = next(r for r in records if r.task == receipt)
        assert dead_receipt.replayed_at is not None
        unknown = next(r for r in records if r.task == payment and r.category == "permanent")
        assert unknown.replayed_at is None  # replayable=False: refused without --force
        assert (s["replay"]["refused"]["dead_letter_id"], s["replay"]["refused"]["exit"]) == (
            unknown.id,
            1,
        )
        replayed = [
            e for e in store.audit_for(str(dead_receipt.correlation_id)) if e.event == "replayed"
        ]
        assert [(e.detail["actor"], e.detail["reason"]) for e in replayed] == [
            ("support:ana", "cus_0009 corrected the e-mail address (ticket 4711)")
        ]
        assert f"-> succeeded  caused by replay:{dead_receipt.id}" in s["trace"]["text"]
    finally:
        store.close()
        engine.dispose()
    assert processes_of(s["run_id"]) == []


@pytest.mark.timeout(300)
def test_the_demo_tells_the_whole_story_on_the_embedded_default_and_its_numbers_are_true() -> None:
    said, summary = run_demo("--embedded")
    assert "ran on the embedded default" in said
    assert "the embedded default cannot show:" in said
    assert "queues" not in summary and summary["redis"] is False
    assert_numbers_are_true(summary)


# the embedded run (the README's default) stays in make test; Redis's 21 s: make chaos
@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_the_demo_on_redis_shows_queue_ages_and_metrics_and_its_numbers_are_true() -> None:
    try:
        redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        unavailable("Redis on localhost:6379", exc)
    said, summary = run_demo()
    assert "ran on Redis on localhost:6379" in said
    peaks = summary["queues"]["peaks"]
    # both queues were sampled; how deep the email burst got depends on how fast the
    # machine drains it, but yesterday's report always waits behind today's (-c 1)
    assert {"email", "heavy"} <= set(peaks) and summary["queues"]["samples"] >= 1
    assert peaks["heavy"]["depth"] >= 1 and peaks["heavy"]["oldest_age"] > 0
    assert "oldest waited" in said
    assert summary["metrics"]["totals"]["jobs_retried_total"] == FLAKY
    assert "celery -A tasks flower" in said and "/metrics" in said
    assert_numbers_are_true(summary)


#: the demo's cluster: three masters and their replicas (the doctor refuses a store
#: cluster without replicas), on ports of this test's own
DEMO_CLUSTER_PORTS = tuple(fixed(port) for port in range(7120, 7126))


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_the_demo_with_its_store_on_a_redis_cluster_runs_unchanged() -> None:
    """docs/howto/redis-cluster.md's command: the reference app and the demo, unchanged,
    with the store on three masters with a replica each (``min_replicas=1``), beside the
    local Redis broker."""
    try:
        redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        unavailable("Redis on localhost:6379", exc)
    with contextlib.contextmanager(support_cluster.running)(DEMO_CLUSTER_PORTS, 1) as cluster:
        store_url = support_cluster.url(cluster.ports[:3], "min_replicas=1")
        said, summary = run_demo(CONVENTIONS_STORE_URL=store_url)
        assert "the store you configured" in said
        assert summary["store_url"] == store_url
        assert_numbers_are_true(summary)  # read on the cluster, before it stops


#: the RabbitMQ the tests run against (guest/guest on this machine and in CI)
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _delete_demo_queues(url: str) -> None:
    """The demo's queues on RabbitMQ, gone before its run (as its Redis databases are
    emptied): a run starts from nothing, whatever an earlier run or version declared."""
    from kombu import Connection

    from tasks import app

    names = set(app.amqp.queues)  # email and heavy (built by the App from the workloads)
    with Connection(url, connect_timeout=5) as connection:
        try:
            connection.ensure_connection(max_retries=1)
        except Exception as exc:
            unavailable("RabbitMQ", exc)
        channel = connection.channel()
        for name in sorted(names):  # each queue and its exchange (a classic run's: direct)
            channel.queue_delete(name)
            channel.exchange_delete(name)


# the demo's third broker (22 s): in make chaos; the embedded and Redis runs stay
@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_the_demo_on_rabbitmq_says_so_and_its_numbers_are_true() -> None:
    _delete_demo_queues(AMQP_URL)
    said, summary = run_demo(CELERY_BROKER_URL=AMQP_URL)
    assert "ran on the broker you configured (RabbitMQ, " in said
    assert "RabbitMQ cannot show:" in said and "the embedded default" not in said
    assert summary["broker"] == "amqp" and summary["redis"] is False
    peaks = summary["queues"]["peaks"]  # depth from a passive declare; ages unknown
    assert {"email", "heavy"} <= set(peaks) and summary["queues"]["samples"] >= 1
    assert summary["metrics"]["totals"]["jobs_retried_total"] == FLAKY
    assert_numbers_are_true(summary)
    # the queues were quorum ones: their dead-letter (poison) queue is there, read by nobody
    # now that the workers stopped, and empty (no job reached its delivery limit)
    from kombu import Connection

    from conventions.observability import queues

    with Connection(AMQP_URL, connect_timeout=5) as connection:
        assert queues.declared(connection, "conventions.poison") == (0, 0)


@pytest.mark.timeout(180)
def test_an_interrupted_demo_stops_every_process_it_started() -> None:
    with subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--embedded"],
        cwd=ROOT, env=demo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as demo:  # fmt: skip
        try:
            assert demo.stdout is not None
            for line in demo.stdout:  # interrupt once every process runs and jobs are in flight
                if "payment webhooks posted" in line:
                    break
            run_id = json.loads((DATA / "run.json").read_text())["run_id"]
            assert len(processes_of(run_id)) >= 8  # sink, web, relay, two workers and pools
            demo.send_signal(signal.SIGINT)
            said = demo.communicate(timeout=90)[0]
        finally:
            if demo.poll() is None:
                demo.kill()
    assert demo.returncode == 130, said
    assert "interrupted; stopping every process it started" in said
    deadline = time.monotonic() + 10
    while processes_of(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(run_id) == []
