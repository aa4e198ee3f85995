"""The migrate: plan each place's steps, show them (the dry run), apply them.

``--apply`` works on one place at a time under its lock (in its stamp: one migrate at a
time per place; another one waits up to ``wait`` seconds, then refuses, naming the
holder). The lock lives ``lock_ttl`` seconds and a thread renews it while the migrate
runs, so a migrate killed outright leaves it for at most ``lock_ttl``. Under the lock the
stamp is read again (another migrate may have moved it meanwhile) and each pending step
runs in order: it may save its cursor as it goes; when it ends, its audit event is
written (``format_migrated``, correlation ``migrate``, the actor and what it changed),
then the new version, fenced by the lock (:class:`~conventions.store.stamps.LockLost`
if the lock was lost: nothing of the step's end is written and a re-run redoes it; each
step is idempotent). Killed inside a step, a re-run resumes that step from its cursor
and never re-runs the steps that ended.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from conventions.observability import audit
from conventions.store.stamps import PROGRESS, progress_field, versions
from conventions.tracing import headers as hdr
from conventions.upgrade.places import Place, current
from conventions.upgrade.steps import Progress, Step

#: the audit event of each step applied, and the trail (correlation id) they are kept in
EVENT: Final = "format_migrated"
TRAIL: Final = "migrate"
#: seconds a migrate's lock outlives the migrate when it is killed (renewed while alive)
LOCK_TTL: Final = 15.0
#: the longest a lock may be set to outlive a killed migrate (a day)
LOCK_TTL_MAX: Final = 86_400.0
#: seconds a migrate waits for another one's lock by default, then refuses
WAIT: Final = 60.0


class Refused(RuntimeError):
    """The migrate cannot run (a newer format than this release, a lock held)."""


@dataclass
class FormatPlan:
    """One format of one place: where it is, where this release wants it, the steps."""

    format: str
    stamped: int | None
    target: int
    steps: list[Step]
    #: the cursor of the step a killed migrate was inside
    cursor: str | None = None

    @property
    def at(self) -> int:
        return self.stamped or 0

    @property
    def newer(self) -> bool:
        return self.at > self.target


@dataclass
class PlacePlan:
    place: Place
    formats: list[FormatPlan] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return sum(len(f.steps) for f in self.formats)


def plan_place(place: Place, registry: list[Step]) -> PlacePlan:
    """What ``place`` needs, from its stamp (InvalidStamp when a version in it is not
    one: never read as unstamped, so never overwritten)."""
    fields = place.stamp.read()
    stamped = versions(fields, place.stamp.where)
    found = PlacePlan(place)
    for name in place.formats(registry):
        at, target = stamped.get(name), current(name, registry)
        steps = [
            s for s in registry
            if s.kind == place.kind and s.format == name and (at or 0) < s.version <= target
        ]  # fmt: skip
        cursor = fields.get(progress_field(name, steps[0].version)) if steps else None
        found.formats.append(FormatPlan(name, at, target, steps, cursor))
    return found


def describe(plan: PlacePlan) -> list[str]:
    """The dry run's lines for one place: each format's versions, each step and what it
    would change."""
    lines = [f"{plan.place.label}:"]
    for fp in plan.formats:
        was = "unstamped" if fp.stamped is None else str(fp.stamped)
        if fp.newer:
            lines.append(
                f"  {fp.format}: at {was}, newer than this release's {fp.target}: "
                "refused (run the migrate of the release that wrote it, or upgrade)"
            )
            continue
        if not fp.steps:
            lines.append(f"  {fp.format}: at {was}, up to date")
            continue
        lines.append(f"  {fp.format}: at {was}, this release's is {fp.target}:")
        for index, step in enumerate(fp.steps):
            cursor = fp.cursor if index == 0 else None
            resumed = f" (resumes from {cursor})" if cursor else ""
            lines.append(f"    step {step.name}: {step.title}{resumed}")
            lines += [f"      {line}" for line in step.preview(plan.place, cursor)]
    return lines


def owner_id() -> str:
    """This migrate's name in the lock: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Keeper(threading.Thread):
    """Renews the lock every third of its ttl until stopped."""

    def __init__(self, place: Place, owner: str, ttl: float) -> None:
        super().__init__(name="conventions-migrate-lock", daemon=True)
        self.place, self.owner, self.ttl = place, owner, ttl
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.ttl / 3):
            try:
                if not self.place.stamp.renew(self.owner, self.ttl):
                    return  # lost: the step's fenced end will say so
            except Exception:  # a blip: the next renewal or the fenced end decides
                continue


def lock(
    place: Place, owner: str, wait: float, ttl: float, echo: Callable[[str], None] = print
) -> None:
    """Take ``place``'s lock, waiting up to ``wait`` seconds (said once); Refused naming
    the holder."""
    deadline = time.monotonic() + wait
    said = False
    while True:
        holder = place.stamp.acquire(owner, ttl)
        if holder is None:
            return
        if not said and wait > 0:
            echo(f"  waiting up to {wait:g}s for the lock another migrate holds ({holder})")
            said = True
        if time.monotonic() >= deadline:
            raise Refused(
                f"another migrate holds {place.label} ({holder}); waited {wait:g}s "
                "(a killed one's lock lapses within its --lock-ttl)"
            )
        time.sleep(min(0.5, max(0.05, deadline - time.monotonic())))


def apply_place(
    app: Any,
    place: Place,
    registry: list[Step],
    *,
    actor: str,
    reason: str | None,
    wait: float = WAIT,
    lock_ttl: float = LOCK_TTL,
    echo: Callable[[str], None] = print,
) -> int:
    """Run ``place``'s pending steps under its lock; how many ran."""
    owner = owner_id()
    lock(place, owner, wait, lock_ttl, echo)
    keeper = _Keeper(place, owner, lock_ttl)
    keeper.start()
    ran = 0
    try:
        plan = plan_place(place, registry)  # again, under the lock
        for fp in plan.formats:
            if fp.newer:
                raise Refused(f"{place.label}: {fp.format} is at {fp.at}, newer than {fp.target}")
            cursor = fp.cursor
            for step in fp.steps:
                _run_step(app, place, owner, step, cursor, actor=actor, reason=reason, echo=echo)
                cursor, ran = None, ran + 1
    finally:
        keeper.stopped.set()
        keeper.join()
        place.stamp.release(owner)
    return ran


def _run_step(
    app: Any,
    place: Place,
    owner: str,
    step: Step,
    cursor: str | None,
    *,
    actor: str,
    reason: str | None,
    echo: Callable[[str], None],
) -> None:
    def save(value: str) -> None:
        place.stamp.checkpoint(owner, step.format, step.version, value)

    resumed = f" (resumes from {cursor})" if cursor else ""
    echo(f"  step {step.name}: {step.title}{resumed}")
    changed = step.apply(place, Progress(cursor, save))
    for line in changed:
        echo(f"    {line}")
    detail = {
        "actor": actor, "reason": reason, "place": place.stamp.where, "format": step.format,
        "version": step.version, "title": step.title, "resumed_from": cursor,
        "changed": changed, "owner": owner,
    }  # fmt: skip
    headers = {hdr.CORRELATION: TRAIL, hdr.ACTOR: actor}
    app.store.add_audit(
        audit.event(EVENT, "", f"{step.format}:{step.version}", headers, detail=detail)
    )
    place.stamp.advance(owner, step.format, step.version)


def progress_fields(fields: dict[str, str]) -> dict[str, str]:
    """The progress fields of a stamp (a killed migrate's cursors)."""
    return {k: v for k, v in fields.items() if k.startswith(PROGRESS)}
