"""The test kit (``conventions.testing``) on an app of its own: what it runs is the real
run path, what it captures never reaches the configured broker or store, its clock is
virtual, and the plugin does nothing at import."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from conventions import App, Backoff, Id, JobContext, Payload, TransientError
from conventions.config import profile
from conventions.jobs import backoff
from conventions.store.records import Category
from conventions.testing import DrainLimit, JobKit
from conventions.tracing import headers as hdr
from conventions.tracing.headers import READY

ROOT = Path(__file__).resolve().parents[2]


class Order(Payload):
    order_id: Id


def make_app(broker: redis.Redis, store: redis.Redis) -> tuple[App, dict[str, Any]]:
    """An app configured for this run's Redis databases (which the kit must not touch),
    its jobs, and a dict the bodies report through."""
    kw = broker.connection_pool.connection_kwargs
    base = f"redis://{kw['host']}:{kw['port']}"
    store_db = store.connection_pool.connection_kwargs["db"]
    app = App("kit_tests", set_as_current=False)
    app.conf.update(
        profile.reliable(
            broker_url=f"{base}/{kw['db']}",
            store_url=f"{base}/{store_db}",
            result_backend=f"{base}/{store_db}",
        ),
        conventions_workloads={"default": "kit"},
    )
    seen: dict[str, Any] = {"fail": 0, "calls": []}

    @app.job("kit.charge.v1", payload=Order, key="charge:{order_id}", workload="default",
             backoff=Backoff(base=1.0, max_attempts=15))  # fmt: skip
    def charge(payload: Order, ctx: JobContext) -> str:
        seen["calls"].append((payload.order_id, ctx.attempt))
        if seen["fail"]:
            seen["fail"] -= 1
            raise TransientError("provider down")
        notify.delay(order_id=payload.order_id)
        return f"charged {payload.order_id}"

    @app.job("kit.notify.v1", payload=Order, key="notify:{order_id}", workload="default")
    def notify(payload: Order, ctx: JobContext) -> None:
        seen["calls"].append(("notify", payload.order_id))

    seen["charge"], seen["notify"] = charge, notify
    return app, seen


@pytest.fixture
def app(
    broker_redis: redis.Redis, store_redis: redis.Redis
) -> Iterator[tuple[App, dict[str, Any]]]:
    broker_redis.flushdb()
    store_redis.flushdb()
    made, seen = make_app(broker_redis, store_redis)
    yield made, seen
    made.close()


@pytest.fixture
def kit(app: tuple[App, dict[str, Any]], tmp_path: Path) -> Iterator[JobKit]:
    with JobKit.open(app[0], store_url=f"sqlite:///{tmp_path / 'store.db'}") as opened:
        yield opened


def test_a_retry_is_captured_with_its_countdown_and_not_run_in_place(
    app: tuple[App, dict[str, Any]], kit: JobKit
) -> None:
    _, seen = app
    seen["fail"] = 1
    run = kit.run(seen["charge"], order_id="o1")

    assert run.outcome == "retried" and run.state == "RETRY"
    assert seen["calls"] == [("o1", 1)]  # eager mode would have run attempt 2 already
    (retry,) = run.published
    assert retry.task_id == run.job.task_id and retry.retries == 1
    assert retry.countdown == run.delay and 0.5 <= (run.delay or 0) <= 1.0
    assert retry.eta is not None
    assert retry.eta == run.ran_at + (retry.eta - retry.published_at)
    assert kit.enqueued() == [retry]
    assert isinstance(run.exception, TransientError)


def test_drained_jobs_run_their_children_in_the_story_of_the_parent(
    app: tuple[App, dict[str, Any]], kit: JobKit
) -> None:
    _, seen = app
    seen["charge"].delay(order_id="o2")

    parent, child = kit.drain()

    assert (parent.job.name, child.job.name) == ("kit.charge.v1", "kit.notify.v1")
    assert child.job in parent.published
    assert child.job.headers[hdr.CAUSATION] == f"job:{parent.job.task_id}"
    assert child.job.correlation_id == parent.job.correlation_id == kit.trace.correlation_id
    assert [e.event for e in kit.events(child)] == ["published", "started", "succeeded"]


def test_a_redelivery_of_a_done_job_is_skipped_as_a_duplicate(
    app: tuple[App, dict[str, Any]], kit: JobKit
) -> None:
    _, seen = app
    first = kit.run(seen["notify"], order_id="o3")
    again = kit.run_job(first.job)  # the same message delivered twice

    assert (first.outcome, again.outcome) == ("succeeded", "skipped_duplicate")
    assert seen["calls"] == [("notify", "o3")]


def test_a_foreign_producers_bad_message_is_dead_lettered_as_invalid(
    app: tuple[App, dict[str, Any]], kit: JobKit
) -> None:
    made, _ = app
    made.send_task("kit.charge.v1", kwargs={"order_id": ""}, **{READY: True})  # unchecked

    (run,) = kit.drain()

    assert run.outcome == "dead_lettered" and run.category == str(Category.INVALID)
    (letter,) = kit.dead_letters("kit.charge.v1")
    assert letter.task_id == run.job.task_id
    assert letter.queue == "kit"  # the delivery info a worker's request carries


def test_a_job_that_never_succeeds_is_exhausted_within_its_backoff_budget_on_the_clock(
    app: tuple[App, dict[str, Any]], kit: JobKit
) -> None:
    _, seen = app
    seen["fail"] = 10_000
    seen["charge"].delay(order_id="o4")

    runs = kit.drain()

    assert len(runs) == 15 and runs[-1].outcome == "dead_lettered"
    assert runs[-1].category == "exhausted"
    budget = Backoff(base=1.0, max_attempts=15).budget(kit.app.conventions_settings.max_countdown)
    assert budget.shortest <= kit.clock.elapsed <= budget.longest


def test_the_drain_stops_at_its_bound(app: tuple[App, dict[str, Any]], kit: JobKit) -> None:
    _, seen = app
    seen["fail"] = 10_000
    seen["charge"].delay(order_id="o5")

    with pytest.raises(DrainLimit, match="3 deliveries ran"):
        kit.drain(max_runs=3)
    assert len(kit.drain(max_runs=2, strict=False)) == 2


def test_a_message_for_another_apps_workers_is_captured_and_left_enqueued(
    app: tuple[App, dict[str, Any]], kit: JobKit
) -> None:
    made, _ = app
    made.send_task("billing.invoice.v1", kwargs={"invoice_id": "i1"}, queue="kit")

    assert kit.drain() == []
    (job,) = kit.enqueued("billing.invoice.v1", invoice_id="i1")
    assert job.queue == "kit" and job.key is None


def test_nothing_reaches_the_configured_broker_or_store_and_the_settings_come_back(
    app: tuple[App, dict[str, Any]],
    broker_redis: redis.Redis,
    store_redis: redis.Redis,
    tmp_path: Path,
) -> None:
    made, seen = app
    before = {name: made.conf.get(name) for name in ("broker_url", "result_backend")}
    with JobKit.open(made, store_url=f"sqlite:///{tmp_path / 's.db'}") as kit:
        seen["fail"] = 2
        seen["charge"].delay(order_id="o6")
        seen["charge"].delay(order_id="o6")
        assert [run.outcome for run in kit.drain()][-2:] == ["succeeded", "succeeded"]
        assert kit.dedup_hits() == 1
    assert broker_redis.dbsize() == 0 and store_redis.dbsize() == 0
    assert {name: made.conf.get(name) for name in before} == before
    assert "now" not in made.__dict__  # Celery's own clock again
    assert "_cc_store" not in made.__dict__


def test_a_redis_database_the_test_owns_is_emptied_and_used(
    app: tuple[App, dict[str, Any]], store_redis: redis.Redis
) -> None:
    made, seen = app
    store_redis.set("left:by:another:test", "1")
    kw = store_redis.connection_pool.connection_kwargs
    url = f"redis://{kw['host']}:{kw['port']}/{kw['db']}"
    with JobKit.open(made, store_url=url) as kit:
        assert store_redis.get("left:by:another:test") is None
        assert kit.run(seen["notify"], order_id="o7").outcome == "succeeded"
        assert store_redis.dbsize() > 0


def test_the_same_seed_draws_the_same_delays_and_leaves_the_jitter_as_it_was(
    app: tuple[App, dict[str, Any]], tmp_path: Path
) -> None:
    made, seen = app
    state = backoff._RANDOM.getstate()
    delays = []
    for n in range(2):
        with JobKit.open(made, store_url=f"sqlite:///{tmp_path / f'{n}.db'}", seed=7) as kit:
            seen["fail"] = 2
            seen["charge"].delay(order_id="o8")
            delays.append([run.delay for run in kit.drain()])
    assert delays[0] == delays[1] and len(delays[0]) == 4
    assert backoff._RANDOM.getstate() == state


def test_stopping_is_a_shutdown_for_the_block_only(kit: JobKit) -> None:
    from conventions.worker import job_context

    with kit.stopping():
        assert job_context.stopping()
    assert not job_context.stopping()


LOAD_PLUGIN = """
import json, sys
from celery import signals
watched = [getattr(signals, n) for n in dir(signals) if hasattr(getattr(signals, n), "receivers")]
before = [len(s.receivers or ()) for s in watched]
import conventions.testing.plugin as plugin
print(json.dumps({
    "receivers_changed": before != [len(s.receivers or ()) for s in watched],
    "kit_imported": "conventions.testing.kit" in sys.modules,
    "fixtures": sorted(n for n in vars(plugin) if n.startswith("cc_")),
}))
"""


def test_loading_the_plugin_connects_nothing_and_imports_no_kit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOAD_PLUGIN], capture_output=True, text=True, timeout=60,
        check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["receivers_changed"] is False
    assert found["kit_imported"] is False
    assert found["fixtures"] == [
        "cc_app", "cc_broker_url", "cc_clock", "cc_kit", "cc_redis_url", "cc_start",
        "cc_store_url", "cc_worker",
    ]  # fmt: skip


def test_the_plugins_fixtures_shadow_none_of_this_repositorys() -> None:
    from conventions.testing import plugin

    ours = {name for name in vars(plugin) if name.startswith("cc_")}
    sources = [ROOT / "tests" / "conftest.py", ROOT / "tests" / "fixtures.py"]
    sources += list((ROOT / "tests").rglob("conftest.py"))
    text = "".join(path.read_text() for path in sources)
    assert not [name for name in ours if f"def {name}(" in text]


def test_the_celery_members_the_kit_resets_are_still_there() -> None:
    """``conventions.testing.isolation`` drops an app's connection pool, producer pool and
    result backend by their private names (Celery 5.7): a release that renames one fails
    here, not in every user's test."""
    from celery import Celery

    plain = Celery("members", set_as_current=False)
    try:
        assert {"_backend_cache", "_local"} <= set(vars(plain))
        assert "_pool" in vars(Celery)  # a class default, set per app when the pool is made
        assert isinstance(vars(Celery)["_backend"], property)
        assert vars(Celery)["_backend"].fset is not None
        assert hasattr(plain.amqp, "_producer_pool")
    finally:
        plain.close()


def test_the_virtual_clock_moves_only_forward_and_only_when_told() -> None:
    import datetime as dt

    from conventions.testing import VirtualClock

    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    clock = VirtualClock(start)
    seen: list[dt.datetime] = []
    clock.before_move.append(seen.append)
    assert clock.now() == start and clock.elapsed == 0
    assert clock.advance(7.3) == start + dt.timedelta(seconds=7.3)
    assert clock.advance_to(start) == start + dt.timedelta(seconds=7.3)  # not back
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)
    assert clock.elapsed == 7.3 and seen == [start]


def test_a_kit_that_cannot_open_its_store_leaves_the_app_as_it_was(
    app: tuple[App, dict[str, Any]],
) -> None:
    made, _ = app
    before = made.conf.get("broker_url")
    with (
        pytest.raises(ValueError, match="unsupported store URL"),
        JobKit.open(made, store_url="nosuch://x"),
    ):
        pass  # pragma: no cover
    assert made.conf.get("broker_url") == before
    assert "now" not in made.__dict__
