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

import uuid
from typing import Any

from conventions.observability import audit
from conventions.schedules import entries as schedules
from conventions.store.base import Store
from conventions.tracing import headers as hdr


def state_name(name: str) -> str:
    return f"schedule:paused:{name}"


def correlation(name: str) -> str:
    """The story of an entry's pauses and resumes."""
    return f"schedule:{name}"


def paused(store: Store, name: str) -> dict[str, Any] | None:
    """The pause record of entry ``name``, or None when it is not paused."""
    return store.get_state(state_name(name))


def _audit(app: Any, event: str, entry: schedules.Entry, detail: dict[str, Any]) -> None:
    headers = {hdr.CORRELATION: correlation(entry.name), hdr.ACTOR: detail.get("actor")}
    audit.record(app.store, event, entry.task, uuid.uuid4().hex, headers, detail=detail)


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
    app.store.put_state(state_name(name), document, None)
    _audit(app, "schedule_paused", entry, document)
    return document


def resume(app: Any, name: str, *, actor: str) -> bool:
    """Let beat send entry ``name`` again, from its next occurrence; False when it was
    not paused. The watchdog watches it from now on (no alarm for the paused time)."""
    entry = schedules.find(app, name)
    was = paused(app.store, name)
    current = schedules.now()
    app.store.delete_state(state_name(name))
    app.store.put_state(f"schedule:watched:{name}", {"since": current.isoformat()}, None)
    _audit(app, "schedule_resumed", entry, {"entry": name, "actor": actor, "paused": was})
    return was is not None
