"""The ``conventions`` command against real Redis and a real (in-process) worker.

Dead letters come from the reference ``payments.apply_event.v1`` (an unknown event id is a
``PermanentError``) and from the test-only ``testing.flaky.v1``, whose provider can be
"fixed" between the failure and the replay.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conventions import bind
from conventions.cli.main import main
from conventions.store.records import AuditEvent, Category, DeadLetter
from conventions.tracing import headers as hdr
from tasks import app
from tasks.payments import apply_event
from tests.integration import support_flaky  # registers testing.flaky.v1 before the worker

ROOT = Path(__file__).resolve().parents[2]
WAIT = 20.0
T = TypeVar("T")

pytestmark = pytest.mark.usefixtures("thread_worker", "clean_store")


def eventually(find: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def dead_letter_of(task: str, task_id: str) -> DeadLetter:
    def find() -> DeadLetter | None:
        records = app.store.list_dead_letters(task=task, limit=1000)
        return next((r for r in records if r.task_id == task_id), None)

    return eventually(find, f"the dead letter of {task}[{task_id}]")


def audit_event(correlation_id: str, name: str, task_id: str) -> AuditEvent:
    def find() -> AuditEvent | None:
        events = app.store.audit_for(correlation_id)
        return next((e for e in events if e.event == name and e.task_id == task_id), None)

    return eventually(find, f"audit event {name!r} of job {task_id}")


def dead_lettered_payment(correlation_id: str | None = None) -> DeadLetter:
    with bind(correlation_id=correlation_id):
        result = apply_event.delay(event_id=f"evt_missing_{uuid.uuid4().hex[:8]}")
    return dead_letter_of("payments.apply_event.v1", result.id)


def dead_lettered_flaky(item_id: str) -> DeadLetter:
    with support_flaky.flags() as client:
        client.set(support_flaky.broken_flag(item_id), "1", ex=300)
    result = support_flaky.flaky.delay(item_id=item_id)
    return dead_letter_of("testing.flaky.v1", result.id)


def fix_provider(item_id: str) -> None:
    with support_flaky.flags() as client:
        client.delete(support_flaky.broken_flag(item_id))


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["-A", "tasks", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def replayed_task_id(out: str, record: DeadLetter) -> str:
    prefix = f"replayed {record.id} as job "
    line = next(line for line in out.splitlines() if line.startswith(prefix))
    return line.removeprefix(prefix).strip()


# -- list and show ---------------------------------------------------------------------------


def test_a_dead_lettered_payment_is_listed_as_permanent_with_its_first_message_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = dead_lettered_payment()

    code, out, _ = run(["dlq", "list"], capsys)

    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["ID", "CATEGORY", "TASK", "ATTEMPTS"]
    row = next(row for row in rows if row.startswith(record.id))
    assert row.split()[1:4] == ["permanent", "payments.apply_event.v1", "1"]
    assert row.endswith(f"unknown payment event {record.payload['event_id']}")


def test_dlq_list_json_filters_by_task_and_category(capsys: pytest.CaptureFixture[str]) -> None:
    payment = dead_lettered_payment()
    flaky = dead_lettered_flaky(f"item_{uuid.uuid4().hex[:8]}")

    code, out, _ = run(["dlq", "list", "--json", "--task", "testing.flaky.v1"], capsys)
    assert code == 0
    assert [r["id"] for r in json.loads(out)] == [flaky.id]

    code, out, _ = run(["dlq", "list", "--json", "--category", "bug", "--since", "1h"], capsys)
    assert (code, json.loads(out)) == (0, [])

    code, out, _ = run(["dlq", "list", "--json", "--category", "permanent"], capsys)
    assert {r["id"] for r in json.loads(out)} == {payment.id, flaky.id}


def test_dlq_list_json_from_a_real_subprocess_shows_the_record() -> None:
    record = dead_lettered_payment()

    done = subprocess.run(
        [sys.executable, "-m", "conventions", "-A", "tasks", "dlq", "list", "--json"],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    listed = {item["id"]: item for item in json.loads(done.stdout)}
    assert listed[record.id]["category"] == "permanent"
    assert listed[record.id]["task"] == "payments.apply_event.v1"
    assert listed[record.id]["payload"] == record.payload
    assert listed[record.id]["idempotency_key"] == (
        f"payments.apply_event:payment-event:{record.payload['event_id']}"
    )


def test_dlq_show_prints_the_full_record_with_payload_headers_and_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = dead_lettered_payment()

    code, out, _ = run(["dlq", "show", record.id, "--json"], capsys)
    assert code == 0
    shown = json.loads(out)
    assert shown["payload"] == record.payload
    assert shown["headers"][hdr.CORRELATION] == record.correlation_id
    assert "PermanentError" in shown["traceback"]

    code, out, _ = run(["dlq", "show", record.id], capsys)
    assert code == 0
    assert f'"event_id": "{record.payload["event_id"]}"' in out
    assert "traceback:" in out
    assert "PermanentError" in out


def test_dlq_show_of_an_unknown_id_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["dlq", "show", "nope"], capsys)

    assert code == 1
    assert "no dead letter with id 'nope'" in err


# -- replay ----------------------------------------------------------------------------------


def test_a_payment_replay_is_refused_without_force_and_leaves_the_record_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = dead_lettered_payment()

    code, out, err = run(["dlq", "replay", record.id, "--reason", "provider fixed"], capsys)

    assert code == 1
    assert out == ""
    assert "replayable=False" in err
    assert app.store.get_dead_letter(record.id) == record


def test_a_forced_payment_replay_keeps_key_and_correlation_and_audits_who_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = dead_lettered_payment()
    assert record.correlation_id

    code, out, _ = run(
        ["dlq", "replay", record.id, "--reason", "event backfilled", "--force", "--actor", "alice"],
        capsys,
    )

    assert code == 0
    new_id = replayed_task_id(out, record)
    marked = app.store.get_dead_letter(record.id)
    assert marked is not None and marked.replayed_at is not None
    replayed = audit_event(record.correlation_id, "replayed", new_id)
    assert replayed.detail == {
        "actor": "alice",
        "reason": "event backfilled",
        "dead_letter_id": record.id,
        "forced": True,
        "replay_of_task_id": record.task_id,
    }
    # the event is still unknown: the replay is dead-lettered again, as the same job
    again = dead_letter_of("payments.apply_event.v1", new_id)
    assert again.idempotency_key == record.idempotency_key
    assert again.correlation_id == record.correlation_id
    assert again.headers[hdr.REPLAY_OF] == record.id
    assert again.headers[hdr.CAUSATION] == f"replay:{record.id}"
    assert again.headers[hdr.ACTOR] == "alice"


def test_a_replay_runs_to_success_once_the_provider_is_fixed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    item = f"item_{uuid.uuid4().hex[:8]}"
    record = dead_lettered_flaky(item)
    assert record.category is Category.PERMANENT
    assert record.correlation_id
    fix_provider(item)

    code, out, _ = run(
        ["dlq", "replay", record.id, "--reason", "provider fixed", "--actor", "bob"], capsys
    )

    assert code == 0
    new_id = replayed_task_id(out, record)
    succeeded = audit_event(record.correlation_id, "succeeded", new_id)
    assert succeeded.idempotency_key == f"flaky:{item}"
    replayed = audit_event(record.correlation_id, "replayed", new_id)
    assert (replayed.detail["actor"], replayed.detail["reason"]) == ("bob", "provider fixed")
    assert replayed.detail["forced"] is False


def test_a_record_already_replayed_is_refused_unless_forced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    item = f"item_{uuid.uuid4().hex[:8]}"
    record = dead_lettered_flaky(item)
    fix_provider(item)
    assert run(["dlq", "replay", record.id, "--reason", "fixed"], capsys)[0] == 0

    code, out, err = run(["dlq", "replay", record.id, "--reason", "again"], capsys)

    assert (code, out) == (1, "")
    assert "already replayed" in err


def test_a_replay_whose_key_is_still_reserved_is_reported_and_leaves_the_record_unmarked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    item = f"item_{uuid.uuid4().hex[:8]}"
    record = dead_lettered_flaky(item)
    assert record.idempotency_key
    assert app.store.reserve(record.idempotency_key, "live-job-1", 60) is None

    code, out, err = run(["dlq", "replay", record.id, "--reason", "fixed"], capsys)

    assert (code, out) == (1, "")
    assert "deduplicated" in err
    assert "live-job-1" in err
    unmarked = app.store.get_dead_letter(record.id)
    assert unmarked is not None and unmarked.replayed_at is None
    fix_provider(item)


def test_replay_all_of_a_task_replays_each_waiting_record_and_prints_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    items = [f"item_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    records = [dead_lettered_flaky(item) for item in items]
    for item in items:
        fix_provider(item)

    code, out, _ = run(
        ["dlq", "replay", "--all", "--task", "testing.flaky.v1", "--reason", "bulk", "--json"],
        capsys,
    )

    assert code == 0
    report = json.loads(out)
    assert {r["dead_letter_id"] for r in report} == {r.id for r in records}
    assert {r["status"] for r in report} == {"replayed"}
    by_record = {r["dead_letter_id"]: r["task_id"] for r in report}
    for record in records:
        assert record.correlation_id
        audit_event(record.correlation_id, "succeeded", by_record[record.id])
    code, out, err = run(
        ["dlq", "replay", "--all", "--task", "testing.flaky.v1", "--reason", "bulk"], capsys
    )
    assert (code, out) == (0, "")
    assert "no dead letters of testing.flaky.v1 waiting" in err


# -- purge, retention, trace -----------------------------------------------------------------


def test_purge_older_than_zero_seconds_deletes_the_dead_letters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = dead_lettered_payment()

    code, out, _ = run(["dlq", "purge", "--older-than", "0s"], capsys)

    assert code == 0
    assert re.match(r"deleted [1-9][0-9]* dead letters", out)
    assert app.store.get_dead_letter(record.id) is None


def test_retention_with_its_defaults_keeps_a_fresh_dead_letter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    record = dead_lettered_payment()

    code, out, _ = run(["retention"], capsys)

    assert code == 0
    assert out.splitlines()[0].startswith("deleted 0 dead letters")
    assert app.store.get_dead_letter(record.id) is not None


def test_retention_purges_the_batches_that_ended_before_the_dead_letter_retention(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from conventions.store import batches as b

    callbacks = {b.ON_COMPLETE: {"task": "t.done.v1"}}
    ended, running = (f"cli-{name}-{uuid.uuid4().hex[:8]}" for name in ("ended", "running"))
    for batch_id in (ended, running):
        assert app.store.create_batch(b.BatchSpec(batch_id, ("m0", "m1"), callbacks))
    app.store.end_member(b.BatchMove((ended,), "m0", b.SUCCEEDED, "t-0"))
    app.store.end_member(b.BatchMove((ended,), "m1", b.SUCCEEDED, "t-1"))
    app.store.callback_sent(ended, b.ON_COMPLETE)

    code, out, _ = run(["retention"], capsys)  # 30 days: both kept
    assert code == 0
    assert out.splitlines()[1].startswith("deleted 0 batches ended before")
    time.sleep(0.05)
    code, out, _ = run(["retention", "--dead-letters", "0s"], capsys)

    assert code == 0
    assert out.splitlines()[1].startswith("deleted 1 batches ended before")
    assert app.store.get_batch(ended) is None
    assert app.store.get_batch(running) is not None  # never ended: kept


def test_trace_shows_the_job_its_events_and_the_replay_beneath_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    correlation = f"corr-{uuid.uuid4().hex}"
    record = dead_lettered_payment(correlation)
    code, out, _ = run(
        ["dlq", "replay", record.id, "--reason", "check", "--force", "--actor", "carol"], capsys
    )
    assert code == 0
    new_id = replayed_task_id(out, record)
    dead_letter_of("payments.apply_event.v1", new_id)

    code, out, _ = run(["trace", correlation, "--json"], capsys)

    assert code == 0
    data: dict[str, Any] = json.loads(out)
    assert data["correlation_id"] == correlation
    [job] = data["jobs"]
    assert (job["task_id"], job["task"]) == (record.task_id, "payments.apply_event.v1")
    assert job["outcome"] == "dead_lettered"
    assert [e["event"] for e in job["events"]] == ["published", "started", "dead_lettered"]
    [child] = job["children"]
    assert (child["task_id"], child["caused_by"]) == (new_id, f"replay:{record.id}")
    assert "replayed" in [e["event"] for e in child["events"]]
    assert child["outcome"] == "dead_lettered"

    code, out, _ = run(["trace", correlation], capsys)
    assert code == 0
    assert f"payments.apply_event.v1 [{record.task_id}]" in out
    assert f"    payments.apply_event.v1 [{new_id}]" in out
    assert "actor=carol" in out


def test_trace_of_an_unknown_correlation_id_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["trace", "no-such-correlation"], capsys)

    assert code == 1
    assert "no audit events" in err
