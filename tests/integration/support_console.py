"""Hostile records for the console's tests, written straight into the real store.

``testing.reset_link.v1`` has a field declared ``sensitive`` and a key built from it:
what the console and the CLI show of it must never hold the token. The hostile records
put script tags, quotes and ``javascript:`` URLs in every field a page shows.
Import this module before building the console: it registers the task on the
reference app (no worker runs it; the records are written as a worker would).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from conventions import Id, JobContext, Payload, PermanentError, sensitive
from conventions.observability import audit
from conventions.ops import pauses
from conventions.schedules import pauses as schedule_pauses
from conventions.store.records import Category, DeadLetter
from conventions.tracing import headers as hdr
from tasks import app

#: one value that breaks out of text, double- and single-quoted attributes, and is a
#: ``javascript:`` URL if a template ever puts a field at the start of an href
XSS = (
    "javascript:alert(1)//\"'><script>alert(2)</script><img src=x onerror=alert(3)>"
    "' autofocus onfocus='alert(4)"
)
#: the same without a slash, for the fields that are part of a URL path (ids)
XSS_ID = "javascript:alert(5)\"'><svg onload=alert(6)>"
TOKEN = "tok_9f8e7d6c5b4a3f2e"


class ResetLink(Payload):
    user_id: Id
    reset_token: Id = sensitive("the mail's link needs it; no operator needs to see it")


@app.job(
    "testing.reset_link.v1",
    payload=ResetLink,
    key="reset:{user_id}:{reset_token}",
    workload="email",
)
def reset_link(payload: ResetLink, ctx: JobContext) -> None:
    raise PermanentError("the mail provider refused the link")


def dead_letter(
    task: str, key: str, payload: dict[str, Any], text: str, where: str | None = None
) -> DeadLetter:
    """A dead letter of ``task`` written to the store: ``text`` in its headers, message
    and traceback, ``where`` (default: ``text``) in its exception type, worker, queue and
    correlation id."""
    now, where = datetime.now(UTC), text if where is None else where
    record = DeadLetter(
        id=uuid.uuid4().hex, task=task, task_id=XSS_ID, category=Category.PERMANENT,
        payload=payload, headers={text: text, hdr.IDEMPOTENCY_KEY: key}, idempotency_key=key,
        exc_type=where, message=text, traceback=text, attempts=1, first_failed_at=now,
        last_failed_at=now, worker=where, queue=where, correlation_id=where,
    )  # fmt: skip
    app.store.put_dead_letter(record)
    return record


def run(task: str, task_id: str, key: str, text: str) -> None:
    """A run of ``task`` with two attempts, written through audit events as a worker's."""
    headers = {
        hdr.CORRELATION: text, hdr.CAUSATION: f"job:{text}", hdr.IDEMPOTENCY_KEY: key,
        hdr.ACTOR: text,
    }  # fmt: skip
    audit.record(app.store, "published", task, task_id, headers, detail={"note": text})
    audit.record(app.store, "started", task, task_id, headers, attempt=1)
    audit.record(app.store, "retried", task, task_id, headers, attempt=1, detail={"error": text})
    audit.record(app.store, "started", task, task_id, headers, attempt=2)


def hostile_everywhere() -> DeadLetter:
    """Hostile text in a dead letter, a run, its trace, a queue's pause and an entry's
    pause; the dead letter is returned."""
    record = dead_letter(XSS, XSS, {XSS: XSS}, XSS)
    run(XSS, XSS_ID, XSS, XSS)
    document = {"queue": "email", "actor": XSS, "at": XSS, "reason": XSS, "workers": []}
    app.store.put_state(pauses.QUEUES.record("email"), document, 300)
    entry = {"entry": "watchdog", "actor": XSS, "at": XSS, "reason": XSS}
    app.store.put_state(schedule_pauses.ENTRIES.record("watchdog"), entry, 300)
    return record


def clear_pauses() -> None:
    app.store.delete_state(pauses.QUEUES.record("email"))
    app.store.delete_state(schedule_pauses.ENTRIES.record("watchdog"))
