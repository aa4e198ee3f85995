"""Every header of ours on a message is untrusted input: junk in any of them never loses
the job nor stops the worker. Real worker (threads), real Redis, foreign raw publishes."""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection, Producer

from conventions.observability import deadletters as deadletter
from conventions.store.records import Category
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")

#: the kinds of junk a producer can put in a header
JUNK: dict[str, Any] = {
    "wrong_type": [1, 2, 3],
    "not_iso": "not-a-date, last tuesday",
    "huge": "x" * 50_000,  # 14 of them stay under the message size cap
    "nested": {"a": {"b": [1, {"c": "ann@example.com"}]}},
}


def _publish(task: str, call_id: str, headers: dict[str, Any]) -> str:
    with Connection(app.conf.broker_url) as conn:
        return publish_foreign(Producer(conn), task, {"call_id": call_id}, "email", headers)


def _cases(kind: str) -> list[dict[str, Any]]:
    """One header of ours set to the junk at a time, then all of them at once (a junk
    string is made unique per message: a key header shared would dedup the jobs)."""
    junk = JUNK[kind]
    cases = [{name: junk} for name in hdr.ALL_HEADERS]
    cases.append(dict.fromkeys(hdr.ALL_HEADERS, junk))
    if isinstance(junk, str):
        cases = [{n: f"{v} #{i}" for n, v in c.items()} for i, c in enumerate(cases)]
    return cases


@pytest.mark.parametrize("kind", sorted(JUNK))
def test_a_failing_job_with_junk_in_our_headers_is_still_dead_lettered(kind: str) -> None:
    sent = {
        _publish("testing.buggy.v1", f"junk_{kind}_{i}", headers): headers
        for i, headers in enumerate(_cases(kind))
    }
    for task_id, headers in sent.items():
        record = wait_for(lambda task_id=task_id: dead_letter_of(task_id), timeout=60)
        assert record.category is Category.BUG, headers
        assert record.payload["call_id"].startswith(f"junk_{kind}_")
        assert record.correlation_id and len(record.correlation_id) <= hdr.MAX_ID
        refused = record.headers.get(deadletter.REFUSED, {})
        if hdr.FIRST_FAILED_AT in headers:  # never a date: refused, kept raw and capped
            assert hdr.FIRST_FAILED_AT in refused
        for raw in refused.values():
            assert len(raw) <= deadletter.MAX_RAW_HEADER
            assert "ann@example.com" not in raw
    assert support_jobs.echo.delay(call_id=f"after_{kind}").get(timeout=30)["call_id"]


@pytest.mark.parametrize("kind", sorted(JUNK))
def test_a_succeeding_job_with_junk_in_our_headers_still_succeeds(kind: str) -> None:
    sent = {
        _publish("testing.echo.v1", f"ok_{kind}_{i}", headers): f"ok_{kind}_{i}"
        for i, headers in enumerate(_cases(kind))
    }
    for task_id, call_id in sent.items():
        assert app.AsyncResult(task_id).get(timeout=60)["call_id"] == call_id
        assert dead_letter_of(task_id) is None
    assert support_jobs.echo.delay(call_id=f"after_ok_{kind}").get(timeout=30)["call_id"]


def test_each_header_reader_refuses_junk_and_keeps_good_values() -> None:
    good = {
        hdr.CORRELATION: "c1", hdr.ENQUEUED_AT: "2026-01-01T00:00:00+00:00",
        hdr.RESUMED: 2, hdr.RECONCILE: "1", hdr.OVERLAP: "skip",
        hdr.LIMITS: {"booked": ["smtp"], "waits": 1},
    }  # fmt: skip
    assert hdr.read_headers(good) == (
        {**good, hdr.LIMITS: {"booked": ["smtp"], "waits": 1}},
        {},
    )
    for junk in JUNK.values():
        read, refused = hdr.read_headers(dict.fromkeys(hdr.ALL_HEADERS, junk))
        assert set(read) | set(refused) == set(hdr.ALL_HEADERS)
        assert hdr.FIRST_FAILED_AT in refused and hdr.RESUMED in refused


def test_a_record_that_cannot_be_built_whole_keeps_what_is_known_and_the_raw_headers() -> None:
    class Hostile:
        id = "t1"

        @property
        def retries(self) -> int:
            raise RuntimeError("no retries here")

    with pytest.raises(RuntimeError):
        deadletter.build(
            task="testing.buggy.v1", request=Hostile(), headers={}, category=Category.BUG,
            payload={}, idempotency_key=None, exc=None, reason="boom",
        )  # fmt: skip
    from conventions.worker.delivery import Delivery

    delivery = Delivery(support_jobs.buggy, Hostile(), {hdr.CORRELATION: "c1"}, {"e": "a@b.io"})
    delivery.refused = {hdr.FIRST_FAILED_AT: "z" * 10_000}
    record = delivery.record(None, Category.BUG, "boom")
    assert record.task == "testing.buggy.v1" and record.task_id == "t1"
    assert record.payload == {"e": "<email>"}
    raw = record.headers[deadletter.REFUSED]
    assert set(raw) == {hdr.CORRELATION, hdr.FIRST_FAILED_AT}
    assert len(raw[hdr.FIRST_FAILED_AT]) <= deadletter.MAX_RAW_HEADER
    assert "boom" in record.message
