"""The chaos suite's report: every run's numbers, ours beside raw Celery's, from one
pytest run, printed (``pytest -s``) and written to ``build/chaos-report.json`` and
``build/chaos-report.md``."""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from pathlib import Path

from tests.acceptance.support_chaos import ROOT, Outcome

BUILD = ROOT / "build"
PROFILES = {
    "ours": "celery-conventions (reliable profile, ledger, once())",
    "default": "raw Celery, default settings",
    "acks_late": "raw Celery, acks_late + reject_on_worker_lost, no idempotency",
}


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def markdown(outcomes: list[Outcome]) -> str:
    lines = [
        "| scenario | profile | jobs | lost | duplicated | receipts missing | dead letters "
        "| seconds |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for out in outcomes:
        lines.append(
            f"| {out.scenario} | {PROFILES[out.profile]} | {out.jobs} | {out.lost} | "
            f"{out.duplicated} | {_cell(out.missing_receipts)} | {_cell(out.dead_letters)} | "
            f"{out.seconds} |"
        )
    lines.append("")
    lines.extend(f"- {out.scenario} / {out.profile}: {out.chaos}" for out in outcomes)
    return "\n".join(lines) + "\n"


def write(outcomes: list[Outcome], folder: Path = BUILD) -> str:
    """Write both files; return the Markdown table."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()}, Python {platform.python_version()})",
        "runs": [out.as_row() for out in outcomes],
    }
    (folder / "chaos-report.json").write_text(json.dumps(document, indent=2) + "\n")
    table = markdown(outcomes)
    (folder / "chaos-report.md").write_text(
        f"# Chaos report\n\nGenerated {document['generated_at']} by "
        "`pytest -m chaos tests/acceptance/test_chaos.py`.\n\n" + table
    )
    return table
