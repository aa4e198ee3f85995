"""Every way out of a job keeps the job when a store or broker call on that way fails.

A retry whose publish fails, a store that goes away on the retry, skip, quarantine,
resume and dead-letter paths, a riding SUCCESS write and a SQL completion that cannot
reach their server: the message stays (it is delivered again) or its dead letter is
written, and the books say what happened. The servers are real and really cut (a TCP
proxy, ``CutProxy``, in front of the machine's Redis or PostgreSQL), never mocked; the
job's body cuts them at the moment the path under test is about to call them.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from celery.exceptions import Reject

from conventions import Backoff, JobContext, PermanentError, TransientError
from conventions.errors import ResumeLater, SkipJob
from conventions.results import redis as results
from conventions.results.redis import RedisBackend
from conventions.store import RedisStore, SQLStore
from conventions.store.records import Category, ClaimStatus
from conventions.tracing import headers as hdr
from tasks import app
from tests.conftest import BROKER_DB, PG_BASE, REDIS_BASE, STORE_DB
from tests.fixtures import unavailable
from tests.integration.helpers import CutProxy, wait_for
from tests.integration.support_jobs import Call

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

QUICK = Backoff(base=0.2, cap=0.5, max_attempts=5)
Step = Callable[[JobContext], Any]
#: what each run of a call does, in order (the last step repeats)
SCRIPT: dict[str, list[Step]] = {}
#: the attempt of every run of a call
RUNS: dict[str, list[int]] = defaultdict(list)


def _follow(payload: Call, ctx: JobContext) -> Any:
    RUNS[payload.call_id].append(ctx.attempt)
    steps = SCRIPT[payload.call_id]
    step = steps.pop(0) if len(steps) > 1 else steps[0]
    return step(ctx)


@app.job("testing.exit_path.v1", payload=Call, key="exit:{call_id}", workload="email",
         backoff=QUICK)  # fmt: skip
def exit_path(payload: Call, ctx: JobContext) -> Any:
    """Runs the next step of its call's script."""
    return _follow(payload, ctx)


@app.job("testing.exit_riding.v1", payload=Call, key="riding:{call_id}", workload="email",
         backoff=QUICK)  # fmt: skip
def exit_riding(payload: Call, ctx: JobContext) -> Any:
    """The same, for the test that gives it a result backend of its own."""
    return _follow(payload, ctx)


def done(ctx: JobContext) -> str:
    return "done"


def raising(exc: BaseException, before: Callable[[], None] | None = None) -> Step:
    def step(ctx: JobContext) -> None:
        if before is not None:
            before()
        raise exc

    return step


def then_done(before: Callable[[], None]) -> Step:
    def step(ctx: JobContext) -> str:
        before()
        return "done"

    return step


@pytest.fixture
def call_id() -> str:
    return f"x{uuid.uuid4().hex[:12]}"


@pytest.fixture
def direct() -> Iterator[RedisStore]:
    """The store's database read without the proxy (the test's own view of the books)."""
    store = RedisStore(f"{REDIS_BASE}/{STORE_DB}")
    yield store
    store.close()


def _redis_port() -> int:
    return int(REDIS_BASE.rsplit(":", 1)[1])


@pytest.fixture
def store_proxy() -> Iterator[CutProxy]:
    """The layer's store reached through a proxy the test cuts (the broker stays up)."""
    proxy = CutProxy(_redis_port())
    store = RedisStore(proxy.url("redis", f"/{STORE_DB}"))
    previous = app.__dict__.get("_cc_store")
    app.__dict__["_cc_store"] = store
    yield proxy
    app.__dict__["_cc_store"] = previous
    proxy.close()
    store.close()


def restore_once_tried(proxy: CutProxy, tries: int = 1) -> None:
    """Wait until a client met the cut server ``tries`` times, then bring it back."""
    wait_for(lambda: proxy.refused >= tries, timeout=30)
    proxy.restore()


def is_reserved(store: Any, key: str) -> bool:
    """Whether a new publish of ``key`` would be deduplicated (probed, then given back)."""
    probe = f"probe-{uuid.uuid4().hex}"
    holder = store.reserve(key, probe, 60)
    if holder is None:
        store.unreserve(key, probe)
    return holder is not None


def dead_letter(store: Any, task_id: str) -> Any:
    return next((r for r in store.list_dead_letters(limit=1000) if r.task_id == task_id), None)


# -- item 1: a retry whose publish fails -------------------------------------------------


@pytest.fixture
def broker_write_proxy() -> Iterator[CutProxy]:
    """Celery's publishes (``broker_write_url``) go through a proxy the test cuts; the
    worker's consumer keeps its own connection (the broker's read side stays up)."""
    proxy = CutProxy(_redis_port())
    app.conf.broker_write_url = proxy.url("redis", f"/{BROKER_DB}")
    app._after_fork()  # forget the pooled connections: the next publish uses the proxy
    yield proxy
    app.conf.broker_write_url = None
    app._after_fork()
    proxy.close()


def test_a_retry_that_cannot_be_published_leaves_its_message_to_run_again(
    broker_write_proxy: CutProxy, direct: RedisStore, call_id: str
) -> None:
    from conventions import bind

    SCRIPT[call_id] = [
        raising(TransientError("provider down"), before=broker_write_proxy.cut),
        raising(TransientError("provider down"), before=broker_write_proxy.restore),
        done,
    ]
    correlation = f"corr-{call_id}"
    with bind(correlation_id=correlation):
        handle = exit_path.delay(call_id=call_id)
    assert handle.get(timeout=60) == "done"
    # the original message ran again (attempt 1), then its published retry (attempt 2)
    assert RUNS[call_id] == [1, 1, 2]
    names = [e.event for e in direct.audit_for(correlation) if e.task_id == handle.id]
    kept = [n for n in names if n in ("started", "retry_failed", "retried", "succeeded")]
    assert kept == ["started", "retry_failed", "started", "retried", "started", "succeeded"]
    assert not is_reserved(direct, f"testing.exit_path:exit:{call_id}")


# -- item 2: the store unreachable on an exit path ----------------------------------------


def test_a_retry_whose_ledger_release_fails_runs_again_once_the_store_is_back(
    store_proxy: CutProxy, call_id: str
) -> None:
    SCRIPT[call_id] = [raising(TransientError("provider down"), before=store_proxy.cut), done]
    handle = exit_path.delay(call_id=call_id)
    restore_once_tried(store_proxy)
    assert handle.get(timeout=60) == "done"
    assert RUNS[call_id] == [1, 2]


def test_a_skip_whose_release_fails_is_kept_until_the_store_takes_it(
    store_proxy: CutProxy, direct: RedisStore, call_id: str
) -> None:
    SCRIPT[call_id] = [raising(SkipJob("nothing to do"), before=store_proxy.cut),
                       raising(SkipJob("nothing to do"))]  # fmt: skip
    handle = exit_path.delay(call_id=call_id)
    restore_once_tried(store_proxy)
    assert handle.get(timeout=60) is None
    assert RUNS[call_id] == [1, 1]  # deferred, not acked: the skip is decided again
    assert not is_reserved(direct, f"testing.exit_path:exit:{call_id}")


def test_a_dead_letter_on_a_store_that_went_away_is_written_once_it_is_back(
    store_proxy: CutProxy, direct: RedisStore, call_id: str
) -> None:
    SCRIPT[call_id] = [raising(PermanentError("gone"), before=store_proxy.cut),
                       raising(PermanentError("gone"))]  # fmt: skip
    handle = exit_path.delay(call_id=call_id)
    restore_once_tried(store_proxy)
    record = wait_for(lambda: dead_letter(direct, handle.id), timeout=60)
    assert record.category is Category.PERMANENT
    assert not is_reserved(direct, f"testing.exit_path:exit:{call_id}")


def test_a_resume_whose_release_fails_still_resumes(store_proxy: CutProxy, call_id: str) -> None:
    SCRIPT[call_id] = [raising(ResumeLater("deploy"), before=store_proxy.cut), done]
    handle = exit_path.delay(call_id=call_id)
    restore_once_tried(store_proxy)
    assert handle.get(timeout=60) == "done"
    assert RUNS[call_id] == [1, 1]


def test_a_reject_raised_by_the_body_stands_when_the_release_fails(
    store_proxy: CutProxy, call_id: str
) -> None:
    SCRIPT[call_id] = [raising(Reject("again", requeue=True), before=store_proxy.cut), done]
    handle = exit_path.delay(call_id=call_id)
    restore_once_tried(store_proxy)
    assert handle.get(timeout=60) == "done"
    assert RUNS[call_id] == [1, 1]


def _claimed_before(store: Any, key: str, task_id: str, times: int) -> None:
    """Count ``times`` claims of the first delivery of ``task_id`` (dead workers)."""
    for n in range(times):
        owner = f"dead-{n}"
        assert store.claim(key, owner, 30, f"{task_id}:0").status is ClaimStatus.CLAIMED
        store.release(key, owner, None)


def test_a_quarantine_whose_release_fails_is_dead_lettered_once_the_store_is_back(
    store_proxy: CutProxy, direct: RedisStore, call_id: str
) -> None:
    task_id, key = str(uuid.uuid4()), f"testing.exit_path:exit:{call_id}"
    SCRIPT[call_id] = [done]
    _claimed_before(direct, key, task_id, app.conventions_settings.max_deliveries)
    store_proxy.cut_after(f"{task_id}:0".encode())  # right after the claim
    exit_path.apply_async(kwargs={"call_id": call_id}, task_id=task_id)
    restore_once_tried(store_proxy)
    record = wait_for(lambda: dead_letter(direct, task_id), timeout=60)
    assert record.category is Category.POISON
    assert RUNS[call_id] == []
    assert not is_reserved(direct, key)


def test_a_done_key_whose_unreserve_fails_is_kept_until_the_store_takes_it(
    store_proxy: CutProxy, direct: RedisStore, call_id: str
) -> None:
    task_id, key = str(uuid.uuid4()), f"testing.exit_path:exit:{call_id}"
    SCRIPT[call_id] = [done]
    direct.claim(key, "earlier", 30, "earlier:0")
    direct.complete(key, "earlier", "succeeded", 600, None)
    store_proxy.cut_after(f"{task_id}:0".encode())  # right after the claim answered DONE
    handle = exit_path.apply_async(kwargs={"call_id": call_id}, task_id=task_id)
    restore_once_tried(store_proxy)
    assert handle.get(timeout=60) is None
    assert RUNS[call_id] == []
    assert not is_reserved(direct, key)


def test_a_scheduled_job_whose_overlap_lease_cannot_be_released_is_not_run_again(
    store_proxy: CutProxy, direct: RedisStore, call_id: str
) -> None:

    SCRIPT[call_id] = [then_done(store_proxy.cut)]
    headers = {hdr.SCHEDULE: f"entry-{call_id}", hdr.OVERLAP: "skip",
               hdr.OCCURRENCE: "2026-12-01T03:00:00+00:00"}  # fmt: skip
    handle = exit_path.apply_async(kwargs={"call_id": call_id}, headers=headers)
    restore_once_tried(store_proxy, tries=2)
    assert handle.get(timeout=60) == "done"
    assert RUNS[call_id] == [1]


# -- item 7: the riding SUCCESS write ------------------------------------------------------


@pytest.fixture
def riding_proxy() -> Iterator[CutProxy]:
    """The store and ``exit_riding``'s result backend on one server reached through a
    proxy (so the completion rides the SUCCESS write), without Celery's always-retry."""
    proxy = CutProxy(_redis_port())
    store = RedisStore(proxy.url("redis", f"/{STORE_DB}"))
    backend = RedisBackend(app=app, url=proxy.url("redis", f"/{BROKER_DB}"))
    backend.always_retry = False  # Celery's default: only the reference config sets it
    assert backend.store_alongside(store) is store
    previous = app.__dict__.get("_cc_store")
    app.__dict__["_cc_store"] = store
    exit_riding.backend = backend
    yield proxy
    exit_riding.backend = None
    app.__dict__["_cc_store"] = previous
    proxy.close()
    store.close()


def test_a_riding_success_write_that_meets_a_lost_server_is_written_once_it_is_back(
    riding_proxy: CutProxy, direct: RedisStore, call_id: str
) -> None:
    SCRIPT[call_id] = [then_done(riding_proxy.cut)]
    handle = exit_riding.delay(call_id=call_id)
    restore_once_tried(riding_proxy, tries=2)
    assert handle.get(timeout=60) == "done"  # read from the backend directly
    claim = direct.claim(f"testing.exit_riding:riding:{call_id}", "probe", 1, "probe:0")
    assert claim.status is ClaimStatus.DONE
    assert not is_reserved(direct, f"testing.exit_riding:riding:{call_id}")
    assert RUNS[call_id] == [1]


def test_a_riding_success_write_refused_past_its_deadline_leaves_a_copy_of_the_job(
    riding_proxy: CutProxy,
    direct: RedisStore,
    call_id: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery records FAILURE and acks after a refused write: the copy published first
    runs the body again once the server is back, and records it done."""
    monkeypatch.setattr(results, "COMPLETION_PATIENCE", 1.0, raising=False)
    SCRIPT[call_id] = [then_done(riding_proxy.cut), done]
    with caplog.at_level(logging.ERROR, logger="conventions.worker.delivery"):
        handle = exit_riding.delay(call_id=call_id)
        wait_for(lambda: any(handle.id in r.getMessage() and "published again" in r.getMessage()
                             for r in caplog.records))  # fmt: skip
    riding_proxy.restore()
    assert wait_for(lambda: RUNS[call_id] == [1, 1] and direct_state(handle.id) == "SUCCESS")
    assert app.AsyncResult(handle.id).get(timeout=10) == "done"
    claim = direct.claim(f"testing.exit_riding:riding:{call_id}", "probe", 1, "probe:0")
    assert claim.status is ClaimStatus.DONE
    assert not is_reserved(direct, f"testing.exit_riding:riding:{call_id}")


def direct_state(task_id: str) -> str:
    return str(app.AsyncResult(task_id).state)


# -- item 17: the SQL store down while a job completes --------------------------------------


@pytest.fixture
def sql_proxy() -> Iterator[tuple[CutProxy, SQLStore]]:
    """A SQL store on a PostgreSQL database of the test's own, reached through a proxy;
    yields the proxy and a store that reads the same database directly."""
    admin_url = PG_BASE.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    name = f"cc_exit_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        unavailable("PostgreSQL", exc)
    host_port = PG_BASE.rsplit("@", 1)[1]
    proxy = CutProxy(int(host_port.rsplit(":", 1)[1]))
    through = SQLStore(PG_BASE.replace(host_port, f"127.0.0.1:{proxy.port}") + f"/{name}")
    reader = SQLStore(f"{PG_BASE}/{name}")
    previous = app.__dict__.get("_cc_store")
    app.__dict__["_cc_store"] = through
    yield proxy, reader
    app.__dict__["_cc_store"] = previous
    proxy.close()
    through.close()
    reader.close()
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_job_that_ran_while_the_sql_store_went_away_is_recorded_done_once_it_is_back(
    sql_proxy: tuple[CutProxy, SQLStore], call_id: str
) -> None:
    proxy, reader = sql_proxy
    SCRIPT[call_id] = [then_done(proxy.cut)]
    handle = exit_path.delay(call_id=call_id)
    restore_once_tried(proxy, tries=2)
    assert handle.get(timeout=60) == "done"
    assert (
        reader.claim(f"testing.exit_path:exit:{call_id}", "probe", 1, "probe:0").status
        is ClaimStatus.DONE
    )
    assert not is_reserved(reader, f"testing.exit_path:exit:{call_id}")
    assert RUNS[call_id] == [1]


def test_a_completion_the_sql_store_never_takes_gives_the_message_back_and_runs_again(
    sql_proxy: tuple[CutProxy, SQLStore],
    call_id: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past its patience the completion gives up: the message is requeued, not acked, and
    its next delivery (the store back) runs the body again and records it done."""
    proxy, reader = sql_proxy
    monkeypatch.setattr(results, "COMPLETION_PATIENCE", 1.0, raising=False)
    SCRIPT[call_id] = [then_done(proxy.cut), done]
    with caplog.at_level(logging.ERROR, logger="conventions.worker.delivery"):
        handle = exit_path.delay(call_id=call_id)
        wait_for(lambda: any(handle.id in r.getMessage() and "requeued" in r.getMessage()
                             for r in caplog.records))  # fmt: skip
    proxy.restore()
    assert handle.get(timeout=60) == "done"
    assert RUNS[call_id] == [1, 1]  # at least once: the body ran again
    assert (
        reader.claim(f"testing.exit_path:exit:{call_id}", "probe", 1, "probe:0").status
        is ClaimStatus.DONE
    )
    assert not is_reserved(reader, f"testing.exit_path:exit:{call_id}")
