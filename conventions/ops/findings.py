"""What the doctor finds: a level, a stable code, a subject and the fix.

``conventions_doctor_levels`` in the app's configuration turns a code into ``"error"``,
``"warning"`` or ``"off"``; :func:`apply_levels` applies it to every check's findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

ERROR = "error"
WARNING = "warning"
OFF = "off"


@dataclass(frozen=True)
class Finding:
    """One problem: its level, a stable code, what it is about, and the fix."""

    level: str
    code: str
    subject: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.level.upper():<8}{self.code}  {self.subject}: {self.message}"


def apply_levels(findings: Iterable[Finding], conf: Any) -> list[Finding]:
    levels: Mapping[str, str] = conf.get("conventions_doctor_levels") or {}
    out = []
    for finding in findings:
        level = levels.get(finding.code, finding.level)
        if level != OFF:
            out.append(Finding(level, finding.code, finding.subject, finding.message))
    return out


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == ERROR]
