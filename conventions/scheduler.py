"""Beat's side of the schedules: send each occurrence once, under its business key.

``beat_scheduler = "conventions.scheduler:Scheduler"`` (a ``PersistentScheduler``)
adds the app's ``conventions_schedule`` entries to ``beat_schedule``. When an entry is
due it sends every occurrence in its window (the current one, and missed ones within
``catch_up``), each through ``send``:

1. ``sent:<key>`` is reserved in the store for ``SENT_KEEP``: the first sender of an
   occurrence wins, whichever beat, restart or ``conventions schedule trigger`` it is.
   Every later send records ``deduplicated`` in the occurrence's audit trail, sends
   nothing, and returns the first job's handle.
2. The job is published through ``ConventionTask.apply_async`` with the payload built
   from the occurrence, the explicit idempotency key ``beat:<entry>:<label>``, the
   occurrence's correlation id, ``cc_causation=beat:<entry>``, ``cc_actor=beat`` and
   the ``cc_schedule``/``cc_occurrence``/``cc_overlap`` headers the worker's guard reads.

The enqueue reservation of the task itself is released when its job finishes
(``until_done``); ``sent:`` is what keeps a late second beat from publishing again.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from celery.beat import PersistentScheduler

from conventions import audit, context, overlap, schedules
from conventions.errors import ConfigurationError
from conventions.schedules import Entry, Occurrence
from conventions.task import ConventionTask, DuplicateResult

logger = logging.getLogger("conventions.scheduler")

#: how long an occurrence stays marked as sent (seconds): longer than any catch-up
SENT_KEEP = 3 * 86400.0


def sent_key(occurrence: Occurrence) -> str:
    """The store reservation that marks an occurrence as sent."""
    return f"sent:{occurrence.key}"


def occurrence_headers(entry: Entry, occurrence: Occurrence, actor: str) -> dict[str, Any]:
    return {
        context.CORRELATION: occurrence.correlation_id,
        context.CAUSATION: f"beat:{entry.name}",
        context.ACTOR: actor,
        context.IDEMPOTENCY_KEY: occurrence.key,
        context.SCHEDULE: entry.name,
        context.OCCURRENCE: occurrence.at.isoformat(),
        context.OVERLAP: entry.overlap,
    }


def send(
    app: Any,
    entry: Entry,
    occurrence: Occurrence,
    *,
    actor: str = "beat",
    extra_headers: dict[str, Any] | None = None,
) -> Any:
    """Publish one occurrence once; a later send of it returns the first job's handle
    (``.deduplicated``) and records ``deduplicated``."""
    task = app.tasks.get(entry.task)
    if not isinstance(task, ConventionTask):
        raise ConfigurationError(
            f"schedule entry {entry.name}: {entry.task!r} is not a registered convention task"
        )
    store = task.store
    headers = {**(extra_headers or {}), **occurrence_headers(entry, occurrence, actor)}
    task_id = str(uuid.uuid4())
    holder = store.reserve(sent_key(occurrence), task_id, SENT_KEEP)
    if holder is not None:
        detail = {"duplicate_of": holder, "occurrence": occurrence.label, "sender": actor}
        audit.record(store, "deduplicated", task.name, holder, headers, detail=detail)
        logger.info("%s %s: already sent as %s", entry.name, occurrence.label, holder)
        _close_sentry_checkin(headers)
        return DuplicateResult(holder, app=app)
    try:
        result = task.apply_async(
            kwargs=entry.payload_for(occurrence),
            task_id=task_id,
            idempotency_key=occurrence.key,
            headers=headers,
        )
    except BaseException:
        store.unreserve(sent_key(occurrence), task_id)
        raise
    if entry.overlap == "replace":
        overlap.announce(store, entry.name, occurrence.at.isoformat())
    logger.info("%s %s: sent as %s", entry.name, occurrence.label, result.id)
    return result


def _close_sentry_checkin(headers: dict[str, Any]) -> None:
    """A duplicate send opened a Sentry Crons check-in (``monitor_beat_tasks``) that no
    job will close: close it as ok, the first send's job reports the real outcome."""
    slug, check_in = headers.get("sentry-monitor-slug"), headers.get("sentry-monitor-check-in-id")
    if not (slug and check_in):
        return
    try:
        from sentry_sdk.crons import capture_checkin

        capture_checkin(monitor_slug=slug, check_in_id=check_in, status="ok", duration=0)
    except Exception:
        logger.warning("could not close the Sentry check-in of %s", slug, exc_info=True)


def trigger(app: Any, name: str, at: datetime | None = None, actor: str = "cli") -> Any:
    """Send the occurrence of entry ``name`` at or before ``at`` (default: now), exactly
    as beat would: a second send of it is a duplicate."""
    entry = schedules.find(app, name)
    moment = at or schedules.now()
    found = entry.schedule.latest(moment)
    if found is None:
        raise ConfigurationError(f"{name} has no occurrence before {moment.isoformat()}")
    return send(app, entry, entry.occurrence(found), actor=actor)


class Scheduler(PersistentScheduler):  # type: ignore[misc]
    """Celery's persistent scheduler, sending the layer's entries occurrence by occurrence."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        schedules.use_clock(app.conf)
        self._entries = {entry.name: entry for entry in schedules.entries_of(app)}
        super().__init__(app, *args, **kwargs)

    def merge_inplace(self, b: dict[str, Any]) -> None:
        """Celery's ``beat_schedule`` plus ours (entries of the same name are ours)."""
        super().merge_inplace({**(b or {}), **schedules.beat_schedule(self._entries.values())})

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        ours = self._entries.get(entry.name)
        if ours is None or ours.task != entry.task:
            return super().apply_async(entry, producer, advance, **kwargs)
        last_run_at = entry.last_run_at
        if advance:
            entry = self.reserve(entry)
        extra = dict(entry.options.get("headers") or {})  # Sentry Crons' check-in, if any
        result = None
        try:
            for moment in ours.schedule.due(last_run_at, schedules.now()):
                try:
                    result = send(self.app, ours, ours.occurrence(moment), extra_headers=extra)
                except Exception:
                    logger.exception("%s: could not send the occurrence at %s", ours.name, moment)
        finally:
            self._tasks_since_sync += 1
            if self.should_sync():
                self._do_sync()
        return result
