"""Log records carry the story they belong to, in text and JSON."""

from __future__ import annotations

import json
import logging

import pytest

from conventions.config import formats
from conventions.tracing import context, logs
from conventions.tracing import headers as hdr
from conventions.worker import signals as tracing


@pytest.fixture(autouse=True)
def installed() -> None:
    logs.install()
    logs.clear_job()


def record(message: str = "hello", exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc else None
    return logging.getLogger("shop").makeRecord(
        "shop", logging.INFO, __file__, 1, message, (), exc_info
    )


def test_a_record_made_in_a_bound_web_request_carries_its_ids() -> None:
    with context.bind(correlation_id="corr-1", request_id="req-1"):
        made = record()
    assert (made.correlation_id, made.request_id, made.task) == ("corr-1", "req-1", None)  # type: ignore[attr-defined]


def test_a_record_made_outside_any_context_carries_none() -> None:
    assert record().correlation_id is None  # type: ignore[attr-defined]


def test_a_record_made_in_a_job_carries_every_job_field() -> None:
    logs.bind_job(
        correlation_id="corr-1", task="email.send_receipt.v2", version="v2",
        task_id="t-1", idempotency_key="receipt:ord_1", attempt=2,
    )  # fmt: skip
    made = record()
    logs.clear_job()
    fields = {name: getattr(made, name) for name in logs.FIELDS}
    assert fields == {
        "correlation_id": "corr-1", "request_id": None, "task": "email.send_receipt.v2",
        "version": "v2", "task_id": "t-1", "idempotency_key": "receipt:ord_1", "attempt": 2,
    }  # fmt: skip


def test_update_job_changes_one_field_and_keeps_the_others() -> None:
    logs.bind_job(correlation_id="corr-1", task="a.b.v1")
    logs.update_job(idempotency_key="k-1")
    made = record()
    logs.clear_job()
    assert (made.correlation_id, made.idempotency_key) == ("corr-1", "k-1")  # type: ignore[attr-defined]


def test_the_json_format_is_one_object_with_the_fields_that_are_set() -> None:
    logs.bind_job(correlation_id="corr-1", task="a.b.v1", task_id="t-1", attempt=1)
    try:
        raise ValueError("boom")
    except ValueError as exc:
        line = logs.formatter("json").format(record("failed %s", exc))
    logs.clear_job()
    data = json.loads(line)
    assert data["correlation_id"] == "corr-1"
    assert data["task_id"] == "t-1"
    assert data["exc_type"] == "ValueError"
    assert "request_id" not in data
    assert "\n" not in line


def test_the_text_format_puts_the_fields_after_the_message_and_the_traceback_below() -> None:
    logs.bind_job(correlation_id="corr-1", task="a.b.v1", task_id="t-1", attempt=3)
    try:
        raise ValueError("boom")
    except ValueError as exc:
        text = logs.formatter("text").format(record("failed", exc))
    logs.clear_job()
    first, _, rest = text.partition("\n")
    assert first.endswith("failed [corr=corr-1 task=a.b.v1 id=t-1 attempt=3]")
    assert "ValueError: boom" in rest


def test_an_unknown_log_format_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'xml' is unknown: use one of \['text', 'json'\]"):
        logs.formatter("xml")


def test_version_of_reads_the_suffix_of_a_task_name() -> None:
    assert logs.version_of("email.send_receipt.v12") == "v12"
    assert logs.version_of("celery.chord_unlock") is None


def test_a_plain_publish_gets_the_bound_context_and_shows_it_in_the_kwargs_repr() -> None:
    headers: dict[str, object] = {"kwargsrepr": "{'x': 1}"}
    with context.bind(correlation_id="corr-1", request_id="req-1", actor_id="user-7"):
        tracing.on_before_publish(headers=headers)
    assert headers[hdr.CORRELATION] == "corr-1"
    assert headers[hdr.CAUSATION] == "request:req-1"
    assert headers[hdr.ACTOR] == "user-7"
    assert hdr.ENQUEUED_AT in headers
    assert headers["kwargsrepr"] == "{'x': 1, '~correlation': 'corr-1'}"


def test_a_publish_outside_any_context_starts_a_new_story_each_time() -> None:
    first: dict[str, object] = {}
    second: dict[str, object] = {}
    tracing.on_before_publish(headers=first)
    tracing.on_before_publish(headers=second)
    assert first[hdr.CORRELATION] != second[hdr.CORRELATION]


def test_a_publish_that_carries_our_headers_keeps_them_and_shows_its_own_id() -> None:
    """A retry or a deferral: its headers are ours already, its kwargs repr is Celery's."""
    headers: dict[str, object] = {hdr.CORRELATION: "mine", "kwargsrepr": "{'x': 1}"}
    with context.bind(correlation_id="other"):
        tracing.on_before_publish(headers=headers)
    assert headers == {
        hdr.CORRELATION: "mine",
        "kwargsrepr": "{'x': 1, '~correlation': 'mine'}",
        hdr.FORMAT: formats.HEADERS,  # this process wrote them: its version
    }
    tracing.on_before_publish(headers=headers)  # shown once
    assert headers["kwargsrepr"] == "{'x': 1, '~correlation': 'mine'}"


def test_the_formatters_read_the_story_from_the_context_when_no_factory_set_it() -> None:
    """A web process that never called ``logs.install()``: a record made without the
    factory still gets the bound correlation id from the layer's formatters."""
    record = logging.LogRecord("web", logging.INFO, __file__, 1, "order placed", None, None)
    assert "correlation_id" not in record.__dict__
    with context.bind(correlation_id="corr-web-1"):
        line = logs.formatter("json").format(record)
        text = logs.formatter("text").format(record)
    assert json.loads(line)["correlation_id"] == "corr-web-1"
    assert text.endswith("[corr=corr-web-1]")
