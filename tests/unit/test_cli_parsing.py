"""The ``conventions`` command without a broker: parsing, argument errors, formatting."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conventions.cli import main as cli
from conventions.cli.format import (
    dead_letter_detail,
    dead_letter_table,
    replay_report,
    table,
    trace_text,
)
from conventions.config.durations import parse_duration, parse_since
from conventions.observability.trace import build_trace
from conventions.ops.replay import ReplayOutcome
from conventions.store.records import AuditEvent, Category, DeadLetter
from conventions.task import DuplicateResult

NOW = datetime(2024, 3, 10, 12, 0, tzinfo=UTC)


def dead_letter(**changes: Any) -> DeadLetter:
    values: dict[str, Any] = {
        "id": "dl1",
        "task": "payments.apply_event.v1",
        "task_id": "t1",
        "category": Category.PERMANENT,
        "payload": {"event_id": "evt_1"},
        "headers": {"cc_correlation": "corr1"},
        "idempotency_key": "payment-event:evt_1",
        "exc_type": "PermanentError",
        "message": "unknown payment event evt_1\nsecond line",
        "traceback": "Traceback (most recent call last):\n  boom",
        "attempts": 1,
        "first_failed_at": NOW,
        "last_failed_at": NOW,
        "worker": "w1@host",
        "correlation_id": "corr1",
    }
    values.update(changes)
    return DeadLetter(**values)


def event(name: str, task_id: str, causation: str | None = None, **kw: Any) -> AuditEvent:
    return AuditEvent(
        event=name,
        task=kw.pop("task", "shop.job.v1"),
        task_id=task_id,
        correlation_id="corr1",
        causation_id=causation,
        attempt=kw.pop("attempt", 0),
        at=NOW,
        detail=kw.pop("detail", {}),
    )


# -- durations and times -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0s", 0),
        ("45s", 45),
        ("30m", 1800),
        ("2h", 7200),
        ("7d", 7 * 86400),
        ("2w", 14 * 86400),
        ("1h30m", 5400),
        ("1.5h", 5400),
        (" 30D ", 30 * 86400),
    ],
)
def test_a_duration_is_a_number_and_a_unit_or_a_sum_of_them(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "5x", "-1d", "h", "1h 30m", "2024-03-01"])
def test_a_duration_without_a_known_unit_is_refused_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 30m"):
        parse_duration(text)


def test_since_as_a_duration_means_that_long_ago() -> None:
    assert parse_since("2h", now=NOW) == NOW - timedelta(hours=2)


def test_since_as_an_iso_date_means_its_midnight_in_utc() -> None:
    assert parse_since("2024-03-01") == datetime(2024, 3, 1, tzinfo=UTC)


def test_since_as_a_naive_datetime_is_read_as_utc() -> None:
    assert parse_since("2024-03-01T12:30") == datetime(2024, 3, 1, 12, 30, tzinfo=UTC)


def test_since_reads_an_explicit_utc_offset_and_answers_in_utc() -> None:
    parsed = parse_since("2024-03-01T12:30+02:00")

    assert parsed == datetime(2024, 3, 1, 10, 30, tzinfo=UTC)
    assert parsed.utcoffset() == timedelta(0)


def test_since_that_is_neither_a_time_nor_a_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="ISO date or datetime"):
        parse_since("yesterday")


# -- arguments -----------------------------------------------------------------------------


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``conventions ARGV``: it must exit 2 with one line on stderr (no traceback)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_replay_without_a_reason_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--reason" in usage_error(["dlq", "replay", "dl1"], capsys)


def test_replay_with_a_blank_reason_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "must not be empty" in usage_error(["dlq", "replay", "dl1", "--reason", " "], capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "replay", "--reason", "x"],
        ["dlq", "replay", "--all", "--reason", "x"],
        ["dlq", "replay", "dl1", "--all", "--task", "a.b.v1", "--reason", "x"],
        ["dlq", "replay", "dl1", "--task", "a.b.v1", "--reason", "x"],
    ],
)
def test_replay_takes_ids_or_all_with_a_task_but_not_both(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--all --task" in usage_error(argv, capsys)


def test_purge_needs_a_duration_it_can_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert "invalid duration '5x'" in usage_error(["dlq", "purge", "--older-than", "5x"], capsys)


def test_purge_without_older_than_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--older-than" in usage_error(["dlq", "purge"], capsys)


def test_list_refuses_an_unknown_category_and_names_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = usage_error(["dlq", "list", "--category", "weird"], capsys)

    assert "permanent" in err
    assert "poison" in err


def test_list_refuses_a_limit_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert "positive" in usage_error(["dlq", "list", "--limit", "0"], capsys)


def test_a_timeout_must_be_a_positive_number_of_seconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "--timeout" in usage_error(["--timeout", "0", "dlq", "list"], capsys)


def test_an_unknown_command_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert "'dlqq'" in usage_error(["dlqq", "list"], capsys)


def test_without_a_command_the_usage_is_shown_and_the_exit_status_is_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "Usage: conventions" in err
    assert "dlq" in err and "doctor" in err


def test_without_an_app_the_command_exits_2_with_one_line_saying_how_to_name_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CONVENTIONS_APP", raising=False)

    err = usage_error(["dlq", "list"], capsys)

    assert "no app" in err and "-A MODULE" in err and "CONVENTIONS_APP" in err


def test_an_app_module_that_does_not_import_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = usage_error(["-A", "no_such_module_here", "dlq", "list"], capsys)
    assert "cannot import the app module 'no_such_module_here'" in err


def test_an_app_that_is_not_a_conventions_app_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert "is not a conventions.App" in usage_error(["-A", "json:loads", "dlq", "list"], capsys)


def test_the_app_comes_from_conventions_app_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVENTIONS_APP", "myproject.worker:celery_app")

    ctx = cli.cli.make_context("conventions", ["trace", "c1"])

    assert ctx.params["app"] == "myproject.worker:celery_app"


def test_the_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0

    assert capsys.readouterr().out.strip() == f"conventions {cli.version()}"
    assert cli.version()[0].isdigit()


def _params(path: list[str], argv: list[str]) -> dict[str, Any]:
    command: Any = cli.cli
    for name in path:
        command = command.commands[name]
    return dict(command.make_context(path[-1], argv).params)


def test_retention_keeps_dead_letters_30_days_and_audit_14_days_by_default() -> None:
    params = _params(["retention"], [])

    assert params["dead_letters"] == timedelta(days=30)
    assert params["audit"] == timedelta(days=14)


def test_the_replay_actor_defaults_to_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "alice")

    assert _params(["dlq", "replay"], ["dl1", "--reason", "x"])["actor"] == "alice"


def test_the_replay_actor_is_cli_without_a_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("USER", raising=False)

    assert _params(["dlq", "replay"], ["dl1", "--reason", "x"])["actor"] == "cli"


# -- formatting ----------------------------------------------------------------------------


def test_a_table_aligns_every_column_but_the_last() -> None:
    lines = table(("A", "LONGER"), [("xxxx", "1"), ("y", "22")]).splitlines()

    assert lines == ["A     LONGER", "xxxx  1", "y     22"]


def test_the_dead_letter_table_shows_one_row_per_record_with_the_first_message_line() -> None:
    text = dead_letter_table(
        [dead_letter(), dead_letter(id="dl22", task="a.b.v1", attempts=12, message="x" * 200)]
    )
    header, first, second = text.splitlines()

    assert header.split() == ["ID", "CATEGORY", "TASK", "ATTEMPTS", "LAST", "FAILURE", "MESSAGE"]
    assert first.split()[:5] == ["dl1", "permanent", "payments.apply_event.v1", "1", "2024-03-10"]
    assert first.endswith("unknown payment event evt_1")
    assert "second line" not in text
    assert second.endswith("x" * 77 + "...")
    assert header.index("MESSAGE") == first.index("unknown") == second.index("xxx")
    column = header.index("ATTEMPTS")
    assert (first[column : column + 2], second[column : column + 2]) == ("1 ", "12")


def test_the_dead_letter_table_marks_replayed_records() -> None:
    assert "[replayed] unknown payment event" in dead_letter_table([dead_letter(replayed_at=NOW)])


def test_the_detail_of_a_dead_letter_shows_payload_headers_and_traceback() -> None:
    text = dead_letter_detail(dead_letter())

    assert '"event_id": "evt_1"' in text
    assert '"cc_correlation": "corr1"' in text
    assert "Traceback (most recent call last):" in text
    assert "idempotency key: payment-event:evt_1" in text
    assert "second line" in text


def test_a_deduplicated_replay_is_reported_with_the_job_that_holds_the_key() -> None:
    report = replay_report(ReplayOutcome("dl1", result=DuplicateResult("holder-1")))

    assert report["status"] == "deduplicated"
    assert report["task_id"] is None
    assert "holder-1" in report["error"]


def test_a_refused_replay_is_reported_with_its_reason() -> None:
    report = replay_report(ReplayOutcome("dl1", error="declared replayable=False"))

    assert report == {
        "dead_letter_id": "dl1",
        "task_id": None,
        "status": "refused",
        "error": "declared replayable=False",
    }


# -- trace ---------------------------------------------------------------------------------


def test_a_trace_hangs_each_job_under_the_job_that_caused_it() -> None:
    roots = build_trace(
        [
            event("published", "p", "request:r1"),
            event("started", "p", "request:r1", attempt=1),
            event("published", "c", "job:p", task="email.send.v1"),
            event("succeeded", "p", "request:r1", attempt=1),
            event("started", "c", "job:p", attempt=1),
            event("retried", "c", "job:p", attempt=1),
            event("started", "c", "job:p", attempt=2),
            event("succeeded", "c", "job:p", attempt=2),
        ]
    )

    assert [job.task_id for job in roots] == ["p"]
    parent = roots[0]
    assert (parent.caused_by, parent.outcome, parent.attempts) == ("request:r1", "succeeded", 1)
    child = parent.children[0]
    assert (child.task, child.caused_by, child.attempts) == ("email.send.v1", "job:p", 2)
    assert [e.event for e in child.events] == [
        "published",
        "started",
        "retried",
        "started",
        "succeeded",
    ]


def test_a_replayed_job_hangs_under_the_job_whose_dead_letter_it_replays() -> None:
    roots = build_trace(
        [
            event("published", "old", "request:r1"),
            event("dead_lettered", "old", "request:r1", detail={"dead_letter_id": "dl1"}),
            event("published", "new", "replay:dl1"),
            event("replayed", "new", "replay:dl1", detail={"actor": "alice", "reason": "fixed"}),
        ]
    )

    assert [job.task_id for job in roots] == ["old"]
    assert roots[0].outcome == "dead_lettered"
    assert roots[0].children[0].task_id == "new"
    assert roots[0].children[0].outcome == "in progress (replayed)"


def test_a_causation_cycle_still_shows_every_job() -> None:
    roots = build_trace([event("published", "a", "job:b"), event("published", "b", "job:a")])

    shown = [job.task_id for job in roots] + [c.task_id for job in roots for c in job.children]
    assert sorted(shown) == ["a", "b"]


def test_the_trace_json_nests_children_with_their_events_and_outcome() -> None:
    roots = build_trace([event("published", "p"), event("published", "c", "job:p")])
    data = json.loads(json.dumps([job.to_dict() for job in roots]))

    assert data[0]["task_id"] == "p"
    assert data[0]["caused_by"] is None
    assert data[0]["children"][0]["task_id"] == "c"
    assert data[0]["children"][0]["events"][0]["event"] == "published"
    assert set(data[0]) == {
        "task_id",
        "task",
        "caused_by",
        "attempts",
        "events",
        "outcome",
        "children",
    }


def test_the_trace_text_indents_children_and_shows_event_details() -> None:
    roots = build_trace(
        [
            event("published", "p", "request:r1"),
            event("published", "c", "job:p", task="email.send.v1"),
            event("retried", "c", "job:p", attempt=1, detail={"delay": 2.5}),
        ]
    )
    lines = trace_text("corr1", roots).splitlines()

    assert lines[0] == "correlation corr1"
    assert lines[1].startswith("shop.job.v1 [p]")
    assert "caused by request:r1" in lines[1]
    assert any(line.startswith("    email.send.v1 [c]") for line in lines)
    assert any("retried" in line and "delay=2.5" in line for line in lines)


def test_an_empty_trace_says_so() -> None:
    assert trace_text("nope", []) == "no audit events for correlation id nope"
