"""The benchmark report: rows of measured numbers, rendered as a Markdown table.

Each row is one comparison with its median (a ratio of two variants measured in the
same rounds, or a time), the target it answers to when there is one, and a note with
the raw medians. ``--json`` keeps the rows with the run's commit, date and load
(:mod:`bench.results`); ``python -m bench.docs`` makes the performance page's table from
that file.
"""

from __future__ import annotations

import operator
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

_OPS = {">=": operator.ge, "<=": operator.le}


@dataclass(frozen=True)
class Row:
    """One measured comparison."""

    section: str
    what: str
    value: float
    #: ``x`` (a ratio), ``ms``, ``jobs/s``, ``us``
    unit: str
    #: ``">= 0.85"``, ``"<= 1"`` or empty
    target: str = ""
    note: str = ""

    def verdict(self) -> str:
        """``met``, ``missed`` or empty (no target)."""
        if not self.target:
            return ""
        op, _, bound = self.target.partition(" ")
        return "met" if _OPS[op](self.value, float(bound)) else "missed"

    def shown(self) -> str:
        if self.value != self.value:  # nan
            return "n/a"
        if self.unit == "x":
            return f"{self.value:.2f}x"
        if self.unit == "ms":
            return f"{self.value:.2f} ms"
        if self.unit in ("cmd/s", "cmd"):
            return f"{self.value:.1f} {self.unit}"
        return f"{self.value:,.0f} {self.unit}"


@dataclass
class Report:
    """Every row of one run, the notes (skips, checks), and how it was run."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)
    command: str = ""
    #: the load average when the run started (:func:`bench.results.load`)
    load_at_start: dict[str, object] | None = None

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def markdown(self) -> str:
        return render(self)

    def save(self, path: Path) -> None:
        from bench import results

        data = {
            **results.meta(self.command, self.load_at_start),
            "machine": machine(),
            "rows": [asdict(row) | {"verdict": row.verdict()} for row in self.rows],
            "notes": self.notes,
            "profile": self.profile,
        }
        results.write(path, data)


def machine() -> str:
    """The machine in one line: cores, load, Python."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores, load average {load} at the end, "
        f"Python {platform.python_version()} on {platform.system()}"
    )


def table(rows: Sequence[Row]) -> list[str]:
    lines = ["| section | what | median | target | note |", "|---|---|---|---|---|"]
    for row in rows:
        target = f"{row.target} ({row.verdict()})" if row.target else ""
        lines.append(f"| {row.section} | {row.what} | {row.shown()} | {target} | {row.note} |")
    return lines


def render(report: Report) -> str:
    """The whole report as Markdown: the table, the notes, the profile."""
    lines = [f"`{report.command}` on {machine()}", "", *table(report.rows)]
    if report.notes:
        lines += ["", "Notes:", "", *(f"- {note}" for note in report.notes)]
    if report.profile:
        lines += [
            "",
            "Profile (worker side, `-P solo`, cProfile):",
            "",
            "```",
            *report.profile,
            "```",
        ]
    return "\n".join(lines) + "\n"
