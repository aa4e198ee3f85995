"""A correlation id's jobs as a tree: the data of ``conventions trace``, for the page.

Events are grouped by job; a job hangs under its cause (``job:<task id>``, or for a
replay ``replay:<dead letter id>``, the job dead-lettered as that record), as the CLI's
``conventions.cli.format.build_trace`` does (the console may not import the CLI).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from conventions.store.records import AuditEvent

#: the events that end a job
FINAL = ("succeeded", "dead_lettered", "skipped", "skipped_duplicate", "quarantined")


@dataclass
class Node:
    """One job of the trace: its events, oldest first, and the jobs it caused."""

    task_id: str
    task: str
    caused_by: str | None = None
    events: list[AuditEvent] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return max((e.attempt for e in self.events), default=0)

    @property
    def outcome(self) -> str:
        final = [e.event for e in self.events if e.event in FINAL]
        if final:
            return final[-1]
        return f"in progress ({self.events[-1].event})" if self.events else "unknown"


def build(events: Sequence[AuditEvent]) -> list[Node]:
    """The root jobs of ``events``, each with its children."""
    jobs: dict[str, Node] = {}
    for event in events:
        jobs.setdefault(event.task_id, Node(event.task_id, event.task)).events.append(event)
    dead_letters: dict[str, str] = {}
    for job in jobs.values():
        published = [e for e in job.events if e.event == "published" and e.causation_id]
        causes = published or [e for e in job.events if e.causation_id]
        job.caused_by = causes[0].causation_id if causes else None
        for event in job.events:
            if event.event == "dead_lettered" and event.detail.get("dead_letter_id"):
                dead_letters[str(event.detail["dead_letter_id"])] = job.task_id
    roots = []
    for job in jobs.values():
        parent = _parent(job, jobs, dead_letters)
        if parent is None or _below(parent, job, jobs, dead_letters):
            roots.append(job)
        else:
            parent.children.append(job)
    return roots


def _parent(job: Node, jobs: dict[str, Node], dead_letters: dict[str, str]) -> Node | None:
    kind, _, ref = (job.caused_by or "").partition(":")
    ref = dead_letters.get(ref, "") if kind == "replay" else ref if kind == "job" else ""
    parent = jobs.get(ref)
    return parent if parent is not job else None


def _below(node: Node, job: Node, jobs: dict[str, Node], dead_letters: dict[str, str]) -> bool:
    """Is ``node`` below ``job`` already (a causation cycle: keep ``job`` a root)?"""
    seen: set[str] = set()
    current: Node | None = node
    while current is not None and current.task_id not in seen:
        if current is job:
            return True
        seen.add(current.task_id)
        current = _parent(current, jobs, dead_letters)
    return False
