"""Exception text leaves the worker scrubbed: its log, Celery's result and events, Sentry.

The jobs in ``support_scrubbing`` raise exceptions that carry an e-mail address (as
``smtplib.SMTPRecipientsRefused`` does). A real ``celery worker`` subprocess runs them; the
test then reads what left the process: the worker's log, the result backend's stored
exception and traceback (what Flower shows), and the ``task-failed`` event. Sentry is
checked in-process with a real client and a transport that keeps the envelopes in memory.
"""

from __future__ import annotations

import json
import smtplib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from conventions.observability import alerts
from tasks import app
from tests.integration import support_scrubbing
from tests.integration.helpers import dead_letter_of, wait_for
from tests.integration.support_scrubbing import ADDRESS

pytestmark = pytest.mark.usefixtures("clean_store")

DOMAIN = ADDRESS.partition("@")[2]


class TaskFailedEvents:
    """The ``task-failed`` events of the broker, received on a thread while the test runs."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(
            self._connection, handlers={"task-failed": self.events.append}
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started = self._receiver.on_consume_ready

        def on_consume_ready(*args: Any, **kwargs: Any) -> None:
            started(*args, **kwargs)
            self.ready.set()

        self._receiver.on_consume_ready = on_consume_ready
        self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> TaskFailedEvents:
        self._thread.start()
        assert self.ready.wait(10), "the event receiver did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(10)
        self._connection.release()

    def of(self, task_id: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("uuid") == task_id), None)


def _stored(task_id: str) -> str:
    """Everything the result backend keeps about the job, as text."""
    meta = app.backend.get_task_meta(task_id)
    return json.dumps(meta, default=str)


def _run(job: Any, received: TaskFailedEvents) -> tuple[str, dict[str, Any], str]:
    """The stored result, the task-failed event and the dead letter's text of one run."""
    result = job.delay(call_id=f"s-{uuid.uuid4().hex[:8]}")
    record = wait_for(lambda: dead_letter_of(result.id), timeout=60)
    result.get(timeout=30, propagate=False)
    event = wait_for(lambda: received.of(result.id), timeout=30)
    return _stored(result.id), event, record.message + record.traceback


def test_exceptions_that_carry_an_address_leave_the_worker_scrubbed_everywhere(
    worker_process: Callable[..., Any],
) -> None:
    """One worker runs both jobs: a refused recipient raised as is, and the same error
    as the cause of a ``PermanentError`` whose own message names the address."""
    with TaskFailedEvents() as received:
        worker = worker_process(
            "scrubbing", "email", concurrency=1, include="tests.integration.support_scrubbing"
        )
        stored, event, kept = _run(support_scrubbing.refused_mail, received)
        wrapped, wrapped_event, _ = _run(support_scrubbing.refused_wrapped, received)
        log = wait_for(
            lambda: worker.output() if wrapped_event["uuid"] in worker.output() else None
        )

    texts = {"log": log, "result": stored, "event": json.dumps(event)}
    texts |= {"wrapped result": wrapped, "wrapped event": json.dumps(wrapped_event)}
    for where, text in texts.items():
        assert DOMAIN not in text, f"the {where} carries the address:\n{text}"
    # what is left is still useful: the type, the scrubbed text, the cause
    assert "SMTPRecipientsRefused" in stored and "<email>" in stored
    assert "SMTPRecipientsRefused" in event["exception"]
    assert "raised expected" in log  # a declared dead letter: one line, no traceback
    cause = str(app.backend.get_task_meta(wrapped_event["uuid"])["traceback"])
    assert "SMTPRecipientsRefused: {'<email>'" in cause and "PermanentError" in cause
    assert DOMAIN not in kept and "<email>" in kept  # the dead letter, as before


# -- Sentry: a real client, envelopes kept in memory -------------------------------------


class MemoryTransport(Transport):
    """Keeps every event the client would send."""

    events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type == "event" and item.payload.json is not None:
                MemoryTransport.events.append(item.payload.json)


@pytest.fixture
def sentry_events() -> Iterator[list[dict[str, Any]]]:
    """Sentry initialised through ``init_sentry`` with the memory transport."""
    MemoryTransport.events = []
    yield MemoryTransport.events
    sentry_sdk.get_client().close(timeout=2)
    sentry_sdk.get_global_scope().set_client(None)


def _fail_with_a_local() -> None:
    recipient = ADDRESS  # a frame local: sentry-sdk sends locals unless told not to
    raise smtplib.SMTPRecipientsRefused({recipient: (550, f"<{recipient}> unknown".encode())})


def _capture(**options: Any) -> dict[str, Any]:
    assert alerts.init_sentry("http://public@127.0.0.1:9/1", transport=MemoryTransport, **options)
    try:
        _fail_with_a_local()
    except smtplib.SMTPRecipientsRefused as exc:
        with sentry_sdk.new_scope() as scope:
            scope.set_extra("recipient", ADDRESS)
            sentry_sdk.add_breadcrumb(message=f"sending to {ADDRESS}")
            sentry_sdk.capture_exception(exc)
    sentry_sdk.flush(timeout=2)
    (event,) = MemoryTransport.events
    return event


def _frames(event: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for value in event["exception"]["values"] for f in value["stacktrace"]["frames"]]


def test_sentry_gets_no_frame_locals_and_no_address_by_default(
    sentry_events: list[dict[str, Any]],
) -> None:
    event = _capture()

    assert DOMAIN not in json.dumps(event)
    assert all("vars" not in frame for frame in _frames(event))
    (value,) = event["exception"]["values"]
    assert value["type"] == "SMTPRecipientsRefused" and "<email>" in value["value"]


def test_sentry_frame_locals_are_sent_scrubbed_when_asked_for(
    sentry_events: list[dict[str, Any]],
) -> None:
    event = _capture(include_local_variables=True)

    assert DOMAIN not in json.dumps(event)
    local = next(f["vars"] for f in _frames(event) if f["function"] == "_fail_with_a_local")
    assert "<email>" in local["recipient"]


def test_a_before_send_of_the_application_still_runs_after_the_scrubbing(
    sentry_events: list[dict[str, Any]],
) -> None:
    seen: list[str] = []

    def before_send(event: Any, hint: Any) -> Any:
        seen.append(json.dumps(event))
        event.setdefault("tags", {})["app"] = "yes"
        return event

    event = _capture(before_send=before_send)

    assert seen and DOMAIN not in seen[0]
    assert event["tags"]["app"] == "yes"
