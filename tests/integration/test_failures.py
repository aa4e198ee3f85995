"""Failure decisions with a real worker, real Redis and a provider on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from conventions.store.records import Category
from tasks import app
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


@pytest.fixture(scope="module")
def provider() -> Iterator[support_jobs.Provider]:
    server = support_jobs.Provider()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    support_jobs.PROVIDER["url"] = server.url
    yield server
    server.shutdown()
    server.server_close()


def _retried(task_id: str, correlation: str) -> list[float]:
    events = app.store.audit_for(correlation)
    return [e.detail["delay"] for e in events if e.task_id == task_id and e.event == "retried"]


def test_a_503_twice_then_200_succeeds_on_attempt_three_with_growing_jittered_delays(
    provider: support_jobs.Provider,
) -> None:
    from conventions import bind

    provider.script["c503"] = [(503, {}), (503, {}), (200, {})]
    with bind(correlation_id="corr-503") as trace:
        result = support_jobs.charge.delay(call_id="c503")
    assert result.get(timeout=30) == "200"
    delays = _retried(result.id, trace.correlation_id)
    assert len(delays) == 2
    for attempt, delay in enumerate(delays, start=1):
        assert 0 <= delay <= support_jobs.FAST.ceiling(attempt)
    keys = {seen["key"] for seen in provider.seen["c503"]}
    assert keys == {"charge:c503"}  # the same idempotency key on every attempt
    started = [e for e in app.store.audit_for("corr-503") if e.event == "started"]
    assert [e.attempt for e in started] == [1, 2, 3]


def test_a_429_with_retry_after_waits_at_least_that_long(
    provider: support_jobs.Provider,
) -> None:
    from conventions import bind

    provider.script["c429"] = [(429, {"Retry-After": "1"}), (200, {})]
    with bind(correlation_id="corr-429"):
        result = support_jobs.charge.delay(call_id="c429")
    assert result.get(timeout=30) == "200"
    assert _retried(result.id, "corr-429")[0] >= 1.0


def test_a_404_is_dead_lettered_as_permanent_after_one_attempt(
    provider: support_jobs.Provider,
) -> None:
    provider.script["c404"] = [(404, {})]
    result = support_jobs.charge.delay(call_id="c404")
    record = wait_for(lambda: dead_letter_of(result.id))
    assert record.category is Category.PERMANENT
    assert record.attempts == 1
    assert len(provider.seen["c404"]) == 1
    assert record.idempotency_key == "testing.charge:charge:c404"


def test_a_type_error_is_dead_lettered_as_a_bug_with_its_traceback() -> None:
    result = support_jobs.buggy.delay(call_id="b1")
    record = wait_for(lambda: dead_letter_of(result.id))
    assert record.category is Category.BUG
    assert record.exc_type == "TypeError"
    assert "Traceback" in record.traceback and "cannot add str and int" in record.traceback
    assert record.attempts == 1


def test_transient_failures_until_the_last_attempt_are_dead_lettered_as_exhausted(
    provider: support_jobs.Provider,
) -> None:
    provider.script["c_always"] = [(503, {})]
    result = support_jobs.charge.delay(call_id="c_always")
    record = wait_for(lambda: dead_letter_of(result.id), timeout=60)
    assert record.category is Category.EXHAUSTED
    assert record.attempts == support_jobs.FAST.max_attempts
    assert len(provider.seen["c_always"]) == support_jobs.FAST.max_attempts


def test_a_dead_lettered_key_does_not_block_a_new_publish(
    provider: support_jobs.Provider,
) -> None:
    provider.script["c_again"] = [(404, {}), (200, {})]
    first = support_jobs.charge.delay(call_id="c_again")
    wait_for(lambda: dead_letter_of(first.id))
    second = support_jobs.charge.delay(call_id="c_again")
    assert second.deduplicated is False
    assert second.get(timeout=30) == "200"
