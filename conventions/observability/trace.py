"""A correlation id's jobs as a tree, from its audit events: what ``conventions trace``
prints and the console's trace page shows.

Events are grouped by job; a job hangs under its cause (``job:<task id>``, or for a
replay ``replay:<dead letter id>``, the job dead-lettered as that record). A causation
cycle (a foreign producer's headers) leaves the job a root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from conventions.store.records import AuditEvent

#: events after which a job is over, whatever comes later in its trail
FINAL = ("succeeded", "dead_lettered", "skipped", "skipped_duplicate", "quarantined")


@dataclass
class Job:
    """One job of a trace: its events, oldest first, and the jobs it caused."""

    task_id: str
    task: str
    caused_by: str | None
    events: list[AuditEvent] = field(default_factory=list)
    children: list[Job] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return max((e.attempt for e in self.events), default=0)

    @property
    def outcome(self) -> str:
        """The last final event, else ``in progress (<last event>)``."""
        final = [e.event for e in self.events if e.event in FINAL]
        if final:
            return final[-1]
        return f"in progress ({self.events[-1].event})" if self.events else "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "task": self.task,
            "caused_by": self.caused_by,
            "attempts": self.attempts,
            "outcome": self.outcome,
            "events": [e.to_dict() for e in self.events],
            "children": [c.to_dict() for c in self.children],
        }


def build_trace(events: Sequence[AuditEvent]) -> list[Job]:
    """Group events by job and hang each job under its cause: ``job:<task id>``, or, for a
    replay (``replay:<dead letter id>``), the job that was dead-lettered as that record."""
    jobs: dict[str, Job] = {}
    for event in events:
        job = jobs.get(event.task_id)
        if job is None:
            job = jobs[event.task_id] = Job(event.task_id, event.task, None)
        job.events.append(event)
    dead_letters: dict[str, str] = {}
    for job in jobs.values():
        published = [e for e in job.events if e.event == "published" and e.causation_id]
        causes = published or [e for e in job.events if e.causation_id]
        job.caused_by = causes[0].causation_id if causes else None
        for event in job.events:
            if event.event == "dead_lettered" and event.detail.get("dead_letter_id"):
                dead_letters[str(event.detail["dead_letter_id"])] = job.task_id
    roots: list[Job] = []
    for job in jobs.values():
        parent = _parent(job, jobs, dead_letters)
        if parent is None or _is_ancestor(job, parent, jobs, dead_letters):
            roots.append(job)
        else:
            parent.children.append(job)
    return roots


def _parent(job: Job, jobs: dict[str, Job], dead_letters: dict[str, str]) -> Job | None:
    kind, _, ref = (job.caused_by or "").partition(":")
    if kind == "job":
        parent = jobs.get(ref)
    elif kind == "replay":
        parent = jobs.get(dead_letters.get(ref, ""))
    else:
        parent = None
    return parent if parent is not job else None


def _is_ancestor(
    job: Job, candidate: Job, jobs: dict[str, Job], dead_letters: dict[str, str]
) -> bool:
    """Is ``job`` above ``candidate`` already (a causation cycle: keep ``job`` a root)?"""
    seen: set[str] = set()
    current: Job | None = candidate
    while current is not None and current.task_id not in seen:
        if current is job:
            return True
        seen.add(current.task_id)
        current = _parent(current, jobs, dead_letters)
    return False
