"""What an operator is shown of a job's data (``conventions.observability.shown``): a
field declared ``sensitive`` is redacted in the payload, in the key built from it, and
wherever else its value appears; the rest is scrubbed as exception texts are."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from conventions import Id, Payload, sensitive
from conventions.observability import shown
from conventions.store.base import KeyState
from conventions.store.records import AuditEvent, Category, DeadLetter
from conventions.store.runs import Attempt, Run

TOKEN = "tok_9f8e7d6c5b4a"


class Reset(Payload):
    user_id: Id
    reset_token: Id = sensitive("the link needs it; shown to nobody")


APP = SimpleNamespace(
    tasks={
        "auth.reset.v1": SimpleNamespace(payload=Reset, key="reset:{user_id}:{reset_token}"),
        "auth.by_callable.v1": SimpleNamespace(payload=Reset, key=lambda p: p.reset_token),
    }
)
NOW = datetime(2026, 12, 2, tzinfo=UTC)


def _record(key: str, task: str = "auth.reset.v1") -> DeadLetter:
    return DeadLetter(
        id="d1", task=task, task_id="t1", category=Category.PERMANENT,
        payload={"user_id": "u_1", "reset_token": TOKEN},
        headers={"cc_idempotency_key": key, "note": "mail ann@example.org"},
        idempotency_key=key, exc_type="ProviderError",
        message=f"refused {TOKEN} for u_1", traceback=f"line\n  token={TOKEN}",
        attempts=1, first_failed_at=NOW, last_failed_at=NOW, worker="w",
    )  # fmt: skip


def test_a_dead_letter_shows_no_sensitive_value_anywhere() -> None:
    record = shown.dead_letter(APP, _record(f"reset:u_1:{TOKEN}"))
    assert TOKEN not in repr(record)
    assert record.payload == {"user_id": "u_1", "reset_token": "<redacted>"}
    assert record.idempotency_key == "reset:u_1:<redacted>"
    assert record.headers["note"] == "mail <email>"
    assert "u_1" in record.message


def test_a_runs_key_is_redacted_from_its_template_without_the_payload() -> None:
    run = Run(
        id="t1", task="auth.reset.v1", state="dead_lettered", created_at=NOW, updated_at=NOW,
        key=f"auth.reset:reset:u_1:{TOKEN}", attempts=(Attempt(1, error="password=hunter2"),),
    )  # fmt: skip
    seen = shown.run(APP, run)
    assert seen.key == "auth.reset:reset:u_1:<redacted>"
    assert seen.attempts[0].error == "password=<redacted>"


def test_a_callable_key_of_a_task_with_sensitive_fields_is_redacted_whole() -> None:
    run = Run(id="t", task="auth.by_callable.v1", state="queued", created_at=NOW, updated_at=NOW,
              key=TOKEN)  # fmt: skip
    assert shown.run(APP, run).key == "<redacted>"


def test_keys_show_redacts_a_key_its_task_template_matches() -> None:
    state = shown.key_state(APP, KeyState(key=f"reset:u_1:{TOKEN}"))
    assert state.key == "reset:u_1:<redacted>"
    other = shown.key_state(APP, KeyState(key="receipt:ann@example.org"))
    assert other.key == "receipt:<email>"


def test_a_trails_keys_and_details_are_shown_as_their_task_hides_them() -> None:
    event = AuditEvent(
        event="retried", task="auth.reset.v1", task_id="t1", correlation_id="c1",
        idempotency_key=f"auth.reset:reset:u_1:{TOKEN}", detail={"error": "password=hunter2"},
    )  # fmt: skip
    [seen] = shown.audit_events(APP, [event])
    assert seen.idempotency_key == "auth.reset:reset:u_1:<redacted>"
    assert seen.detail == {"error": "password=<redacted>"}
    assert (seen.event, seen.task_id, seen.correlation_id) == ("retried", "t1", "c1")
