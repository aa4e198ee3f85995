"""What the ``conventions`` command parses and prints: durations, tables, records, traces.

No broker, no store: plain functions over strings and records, tested on their own.

Records hold what producers chose (headers, payload fields, exception messages, worker
names): nothing of it reaches the operator's terminal raw. Each field shown on a line
of its own is escaped whole (:func:`shown`: a newline cannot forge a line), and every
command writes through :func:`guarded`, which escapes every other control character
(ANSI escapes, carriage returns, direction overrides) in whatever it prints, so that a
field a formatter forgot still cannot recolour or rewrite the screen. Both use
:func:`conventions.tracing.escaping.escape`; JSON output escapes by itself.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from conventions.observability.trace import Job
from conventions.ops.replay import ReplayOutcome
from conventions.store import key_forms
from conventions.store.records import DeadLetter
from conventions.tracing.escaping import escape

#: the longest message shown in a table cell
MESSAGE_WIDTH = 80


def shown(value: object) -> str:
    """A field for one line of the terminal: its text with every control character,
    newlines included, escaped."""
    return escape(str(value))


class Terminal:
    """A text stream that escapes the control characters of what is written to it
    (line breaks kept: the command's own layout); ``raw`` is the stream itself, for
    the command's own escapes (``queues --watch`` clearing the screen)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(escape(text, newlines=False))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Run a command with stdout and stderr escaping what it prints."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Terminal(out), Terminal(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def when(value: datetime | None, *, millis: bool = False) -> str:
    """A time as ``2024-03-01 12:00:00Z`` (UTC; ``12:00:00.123Z`` with millis), or ``-``."""
    if value is None:
        return "-"
    utc = value.astimezone(UTC)
    if millis:
        return utc.strftime("%Y-%m-%d %H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    return utc.strftime("%Y-%m-%d %H:%M:%SZ")


def first_line(text: str, width: int = MESSAGE_WIDTH) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    cells = [[str(h) for h in headers], *([shown(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def dead_letter_table(records: Sequence[DeadLetter]) -> str:
    rows = [
        (
            r.id,
            r.category,
            r.task,
            r.attempts,
            when(r.last_failed_at),
            ("[replayed] " if r.replayed_at else "") + first_line(r.message),
        )
        for r in records
    ]
    return table(("ID", "CATEGORY", "TASK", "ATTEMPTS", "LAST FAILURE", "MESSAGE"), rows)


def dead_letter_detail(record: DeadLetter) -> str:
    """Every field of a record, for ``dlq show``."""
    fields = [
        ("id", record.id),
        ("task", record.task),
        ("task id", record.task_id),
        ("category", record.category),
        ("exception", record.exc_type),
        ("attempts", record.attempts),
        ("first failure", when(record.first_failed_at)),
        ("last failure", when(record.last_failed_at)),
        ("worker", record.worker),
        ("queue", record.queue or "-"),
        ("correlation id", record.correlation_id or "-"),
        ("idempotency key", key_forms.both(record.task, record.idempotency_key)[0]),
        ("store key", key_forms.both(record.task, record.idempotency_key)[1]),
        ("replayed", when(record.replayed_at) if record.replayed_at else "no"),
    ]
    width = max(len(name) for name, _ in fields) + 1
    out = [f"{(name + ':').ljust(width)} {shown(value)}" for name, value in fields]
    out += ["", "message:", _indent(record.message)]
    out += ["", "payload:", _indent(json.dumps(record.payload, indent=2, sort_keys=True))]
    out += ["", "headers:", _indent(json.dumps(record.headers, indent=2, sort_keys=True))]
    out += ["", "traceback:", _indent(record.traceback or "(none)")]
    return "\n".join(out)


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def replay_report(outcome: ReplayOutcome) -> dict[str, Any]:
    """One replay as JSON-ready data: its status, the new job id or why not."""
    item: dict[str, Any] = {
        "dead_letter_id": outcome.record_id,
        "task_id": None,
        "status": "replayed",
        "error": None,
    }
    if outcome.result is None:
        item.update(status="refused", error=outcome.error)
    elif not outcome.replayed:
        item.update(
            status="deduplicated",
            error=(
                f"its idempotency key is still reserved by job {outcome.result.id}: nothing was "
                "published and the record stays as it is (wait for that job, then replay again)"
            ),
        )
    else:
        item["task_id"] = str(outcome.result.id)
    return item


# -- trace -------------------------------------------------------------------------------


def trace_text(correlation_id: str, roots: Sequence[Job]) -> str:
    if not roots:
        return f"no audit events for correlation id {shown(correlation_id)}"
    out = [f"correlation {shown(correlation_id)}"]

    def render(job: Job, depth: int) -> None:
        pad = "    " * depth
        cause = f"  caused by {shown(job.caused_by)}" if job.caused_by else ""
        out.append(
            f"{pad}{shown(job.task)} [{shown(job.task_id)}]  attempts {job.attempts}  "
            f"-> {shown(job.outcome)}{cause}"
        )
        for event in job.events:
            out.append(
                f"{pad}    {when(event.at, millis=True)}  {shown(event.event):<17} "
                f"attempt {event.attempt}"
                f"{_detail(event.detail)}"
            )
        for child in job.children:
            render(child, depth + 1)

    for root in roots:
        render(root, 0)
    return "\n".join(out)


def _detail(detail: dict[str, Any]) -> str:
    if not detail:
        return ""
    return "  " + " ".join(f"{shown(k)}={shown(first_line(str(v), 60))}" for k, v in detail.items())
