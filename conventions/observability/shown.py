"""What an operator is shown of a job's data: scrubbed the same way on every surface.

The console's pages and the CLI (``dlq show``, ``runs show``, ``keys show``) show a
job's payload, headers, idempotency key, error and logs. Each goes through here, so
that what one surface hides no other prints:

* a payload field declared with ``sensitive(...)`` shows ``<redacted>``: the name looked
  like a secret and the declaration vouched for it, which is no reason to print it;
* an idempotency key built from such a field (its template names the field) shows
  ``<redacted>`` in that field's place (a batch member's name is its key: the same);
  the key of a task whose key is a callable and whose payload has such fields is
  redacted whole when the payload is not at hand;
* the values of those fields are replaced wherever else they appear (headers, the
  message, the traceback) when the payload is known;
* then every string is scrubbed as exception texts are
  (:func:`conventions.tracing.scrubbing.scrub_text`: e-mail addresses, card-like
  numbers, ``password=...`` values, URL credentials).
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

from conventions.store import keys
from conventions.store.base import KeyState
from conventions.store.records import AuditEvent, DeadLetter
from conventions.store.runs import Run
from conventions.tracing.scrubbing import scrub_text

#: what a sensitive value is shown as
REDACTED = "<redacted>"
#: a sensitive value shorter than this is not searched for in free text (it would
#: blank every "1" of a traceback); its field and its place in a key are still hidden
MIN_SEARCHED = 4


def sensitive_fields(app: Any, task: str) -> frozenset[str]:
    """The payload fields of ``task`` declared with ``sensitive(...)`` (none for a task
    this app does not know)."""
    tasks = getattr(app, "tasks", None)
    found = tasks.get(task) if tasks is not None else None
    model = getattr(found, "payload", None)
    fields = getattr(model, "model_fields", None)
    if not isinstance(fields, Mapping):
        return frozenset()
    out = set()
    for name, info in fields.items():
        extra = getattr(info, "json_schema_extra", None)
        if isinstance(extra, dict) and extra.get("sensitive_reason"):
            out.add(str(name))
    return frozenset(out)


def _pattern(template: str, hidden: frozenset[str]) -> re.Pattern[str] | None:
    """A regular expression matching keys of ``template``, a group per hidden field."""
    parts, groups = [], 0
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            if name in hidden:
                groups += 1
                parts.append("(.*?)")
            else:
                parts.append("(?:.*?)")
    return re.compile("".join(parts), re.DOTALL) if groups else None


class Shown:
    """The scrubbing of one job's data, knowing its task (and its payload, when given)."""

    def __init__(self, app: Any, task: str, payload: Mapping[str, Any] | None = None) -> None:
        self.task = task
        self.hidden = sensitive_fields(app, task)
        found = getattr(app, "tasks", {}).get(task) if app is not None else None
        template = getattr(found, "key", None)
        self.template = template if isinstance(template, str) else None
        self.callable_key = callable(template)
        values = {str(payload[name]) for name in self.hidden if payload and name in payload}
        self.values = sorted((v for v in values if len(v) >= MIN_SEARCHED), key=len, reverse=True)
        self.known = payload is not None

    def text(self, value: str) -> str:
        """``value`` with every sensitive value replaced, then scrubbed."""
        for secret in self.values:
            value = value.replace(secret, REDACTED)
        return scrub_text(value)

    def data(self, value: Any) -> Any:
        """A payload (or headers): sensitive fields redacted, every string scrubbed."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                self.text(str(k)): REDACTED if k in self.hidden else self.data(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value

    def key(self, key: str | None) -> str | None:
        """An idempotency key (bare or namespaced) with its sensitive parts redacted."""
        if not key or not self.hidden:
            return self.text(key) if key else key
        bare = keys.bare(self.task, key)
        prefix = key[: len(key) - len(bare)]
        pattern = _pattern(self.template, self.hidden) if self.template else None
        found = pattern.fullmatch(bare) if pattern else None
        if found:
            pieces, last = [], 0
            for index in range(1, (found.lastindex or 0) + 1):
                pieces += [bare[last : found.start(index)], REDACTED]
                last = found.end(index)
            bare = "".join([*pieces, bare[last:]])
        elif self.callable_key and not self.known:
            return prefix + REDACTED
        return prefix + self.text(bare)


def dead_letter(app: Any, record: DeadLetter) -> DeadLetter:
    """``record`` as an operator is shown it (``dlq show``, the console's page)."""
    shown = Shown(app, record.task, record.payload)
    return dataclasses.replace(
        record,
        payload=shown.data(record.payload),
        headers=shown.data(record.headers),
        idempotency_key=shown.key(record.idempotency_key),
        message=shown.text(record.message),
        traceback=shown.text(record.traceback),
    )


def run(app: Any, found: Run) -> Run:
    """``found`` as an operator is shown it (``runs show``, the console's pages)."""
    shown = Shown(app, found.task)
    attempts = tuple(
        dataclasses.replace(a, error=shown.text(a.error) if a.error else a.error)
        for a in found.attempts
    )
    logs = tuple(shown.text(line) for line in found.logs)
    return dataclasses.replace(found, key=shown.key(found.key), attempts=attempts, logs=logs)


def key_state(app: Any, state: KeyState) -> KeyState:
    """``conventions keys show``: the key as the task it belongs to hides it."""
    return dataclasses.replace(state, key=any_key(app, state.key))


def any_key(app: Any, key: str) -> str:
    """A key whose task is not at hand (``keys show``, a batch member's name), as the task
    it belongs to hides it: the task whose namespace prefixes it, else the first whose
    template it matches; else scrubbed as any text."""
    tasks = getattr(app, "tasks", {})
    for name in sorted(tasks):
        shown = Shown(app, name)
        if not shown.hidden:
            continue
        namespaced = key.startswith(f"{keys.namespace(name)}:")
        pattern = _pattern(shown.template, shown.hidden) if shown.template else None
        if namespaced or (pattern and pattern.fullmatch(key)):
            return shown.key(key) or key
    return scrub_text(key)


def audit_events(app: Any, events: Iterable[AuditEvent]) -> list[AuditEvent]:
    """A trail as an operator is shown it (``conventions trace``, the console's trace and
    dead-letter pages): each event's key and details scrubbed as its task hides them."""
    by_task: dict[str, Shown] = {}
    out = []
    for event in events:
        shown = by_task.get(event.task) or by_task.setdefault(event.task, Shown(app, event.task))
        out.append(
            dataclasses.replace(
                event,
                idempotency_key=shown.key(event.idempotency_key),
                detail=shown.data(event.detail),
            )
        )
    return out
