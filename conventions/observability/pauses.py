"""Pause records: what an operator paused, kept in the store and audited.

Two things can be paused: a queue (``conventions.ops.pauses``: the workers stop
consuming it) and a schedule entry (``conventions.schedules.pauses``: beat stops sending
it). What they do differs; their record does not, and lives here: a state document
``<kind>:paused:<name>`` (who, when, why, and what the kind adds), and audit events
under the correlation id ``<kind>:<name>`` (``conventions trace queue:email``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from conventions.observability import audit
from conventions.store.base import Store
from conventions.tracing import headers as hdr


@dataclass(frozen=True)
class Pauses:
    """The pause records of one kind of thing (``queue``, ``schedule``)."""

    kind: str

    def record(self, name: str) -> str:
        """The state document's name for ``name``'s pause."""
        return f"{self.kind}:paused:{name}"

    def correlation(self, name: str) -> str:
        """The correlation id of ``name``'s pauses and resumes (its story)."""
        return f"{self.kind}:{name}"

    def get(self, store: Store, name: str) -> dict[str, Any] | None:
        """``name``'s pause record, or None when it is not paused."""
        return store.get_state(self.record(name))

    def get_many(self, store: Store, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The pause records of those of ``names`` that are paused: one read on a store
        that reads many documents at once (Redis: one ``MGET``, one per hash slot on
        Redis Cluster), else one per name."""
        names = list(names)
        many = getattr(store, "get_states", None)
        if many is not None:
            records = {self.record(name): name for name in names}
            return {records[key]: document for key, document in many(list(records)).items()}
        found = ((name, self.get(store, name)) for name in names)
        return {name: document for name, document in found if document is not None}

    def keep(self, store: Store, name: str, document: dict[str, Any]) -> None:
        store.put_state(self.record(name), document, None)

    def drop(self, store: Store, name: str) -> None:
        store.delete_state(self.record(name))

    def audit(self, store: Store, event: str, task: str, name: str, detail: dict[str, Any]) -> None:
        """Audit ``event`` (``queue_paused``, ``schedule_resumed``...) with its actor."""
        headers = {hdr.CORRELATION: self.correlation(name), hdr.ACTOR: detail.get("actor")}
        audit.record(store, event, task, uuid.uuid4().hex, headers, detail=detail)
