"""Pausing a schedule entry: beat sends none of its occurrences until it is resumed.

An operator pauses an entry (the console's schedules page, ``conventions schedule
pause``) while what it feeds is down or being moved. The pause is a record in the store,
``schedule:paused:<entry>`` (who, when, why), read by beat before each send
(``conventions.schedules.beat.send``): an occurrence that falls due meanwhile is not
sent, and is not caught up after the resume (a trigger sends one by hand, paused or
not: a trigger is an operator's explicit act). The watchdog raises no alarm for a paused
entry and, once it is resumed, counts from the resume. Pauses and resumes are audited
under the correlation id ``schedule:<entry>``.
"""

from __future__ import annotations

from typing import Any

from conventions.observability.pauses import Pauses
from conventions.schedules import entries as schedules

#: the entries' pause records (``schedule:paused:<entry>``, audited under ``schedule:<entry>``)
ENTRIES = Pauses("schedule")


def pause(app: Any, name: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Stop beat sending entry ``name``'s occurrences; the pause record. A
    ``ConfigurationError`` names an entry the app does not have; a reason is required."""
    entry = schedules.find(app, name)
    if not reason.strip():
        raise ValueError("a pause needs a reason (it is kept in the audit trail)")
    document = {
        "entry": name,
        "actor": actor,
        "reason": reason.strip(),
        "at": schedules.now().isoformat(timespec="seconds"),
    }
    ENTRIES.keep(app.store, name, document)
    ENTRIES.audit(app.store, "schedule_paused", entry.task, name, document)
    return document


def resume(app: Any, name: str, *, actor: str) -> bool:
    """Let beat send entry ``name`` again, from its next occurrence; False when it was
    not paused. The watchdog watches it from now on (no alarm for the paused time)."""
    entry = schedules.find(app, name)
    was = ENTRIES.get(app.store, name)
    current = schedules.now()
    ENTRIES.drop(app.store, name)
    app.store.put_state(f"schedule:watched:{name}", {"since": current.isoformat()}, None)
    detail = {"entry": name, "actor": actor, "paused": was}
    ENTRIES.audit(app.store, "schedule_resumed", entry.task, name, detail)
    return was is not None
