"""Beat's side of the schedules: send each occurrence once, under its business key.

``beat_scheduler = "conventions.schedules.beat:Scheduler"`` (a ``PersistentScheduler``)
adds the app's ``conventions_schedule`` entries to ``beat_schedule``. When an entry is
due it sends every occurrence in its window (the current one, and missed ones within
``catch_up``), each through ``send``, which publishes first and records the send after:

1. The state document ``schedule:sent:<key>`` says the occurrence was sent: a send that
   finds it (another beat, a restart, ``conventions schedule trigger``) records
   ``deduplicated`` in the occurrence's audit trail, sends nothing, and returns the
   first job's handle.
2. Otherwise the job is published through ``ConventionTask.apply_async`` with the
   payload built from the occurrence, the explicit idempotency key
   ``beat:<entry>:<label>``, the occurrence's correlation id, ``cc_causation=beat:<entry>``,
   ``cc_actor=beat`` and the ``cc_schedule``/``cc_occurrence``/``cc_overlap`` headers the
   worker's guard reads. Two sends at once are one job: the task's enqueue reservation of
   the business key answers the second with the first job (``deduplicated``).
3. Only after the publish succeeded, ``schedule:sent:<key>`` is written for ``SENT_KEEP``.

A beat killed between 2 and 3 leaves a published job and no record: the next send
publishes again, and the enqueue reservation (job still pending) or the execution ledger
(job done: ``skipped_duplicate``) absorbs it, so the body runs once. Nothing written
before the publish can suppress an occurrence whose job was never published.

A paused entry (``conventions.schedules.pauses``) is not sent by beat: ``send`` finds
its pause record first, logs it and returns None. ``trigger`` sends it anyway.

The enqueue reservation of the task itself is released when its job finishes
(``until_done``); ``schedule:sent:`` is what keeps a late second beat from publishing again.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from datetime import datetime
from typing import Any, cast

from celery.beat import PersistentScheduler

from conventions.errors import ConfigurationError
from conventions.observability import audit
from conventions.schedules import entries as schedules
from conventions.schedules import overlap, pauses
from conventions.schedules.entries import Entry, Occurrence
from conventions.task import ConventionTask, DuplicateResult
from conventions.tracing import headers as hdr
from conventions.tracing import spans

logger = logging.getLogger("conventions.schedules.beat")

#: how long an occurrence stays recorded as sent (seconds): longer than any catch-up
SENT_KEEP = 3 * 86400.0


def sent_key(occurrence: Occurrence) -> str:
    """The store's state document that records an occurrence as sent (after its publish)."""
    return f"schedule:sent:{occurrence.key}"


def occurrence_headers(entry: Entry, occurrence: Occurrence, actor: str) -> dict[str, Any]:
    return {
        hdr.CORRELATION: occurrence.correlation_id,
        hdr.CAUSATION: f"beat:{entry.name}",
        hdr.ACTOR: actor,
        hdr.IDEMPOTENCY_KEY: occurrence.key,
        hdr.SCHEDULE: entry.name,
        hdr.OCCURRENCE: occurrence.at.isoformat(),
        hdr.OVERLAP: entry.overlap,
    }


def _task_of(app: Any, entry: Entry) -> ConventionTask:
    task = app.tasks.get(entry.task)
    if not isinstance(task, ConventionTask):
        raise ConfigurationError(
            f"schedule entry {entry.name}: {entry.task!r} is not a registered convention task"
        )
    return task


def send(
    app: Any,
    entry: Entry,
    occurrence: Occurrence,
    *,
    actor: str = "beat",
    extra_headers: dict[str, Any] | None = None,
    manual: bool = False,
) -> Any:
    """Publish one occurrence once; a later send of it returns the first job's handle
    (``.deduplicated``) and records ``deduplicated``. None, and nothing sent, while the
    entry is paused, unless ``manual`` (a trigger)."""
    task = _task_of(app, entry)
    held = None if manual else pauses.ENTRIES.get(task.store, entry.name)
    if held is not None:
        logger.info(
            "%s %s: not sent, the entry is paused (by %s at %s: %s)",
            entry.name, occurrence.label, held.get("actor"), held.get("at"), held.get("reason"),
        )  # fmt: skip
        return None
    headers = {**(extra_headers or {}), **occurrence_headers(entry, occurrence, actor)}
    sent = task.store.get_state(sent_key(occurrence))
    if sent is not None:
        holder = str(sent.get("task_id"))
        detail = {"duplicate_of": holder, "occurrence": occurrence.label, "sender": actor}
        audit.record(task.store, "deduplicated", task.name, holder, headers, detail=detail)
        logger.info("%s %s: already sent as %s", entry.name, occurrence.label, holder)
        _close_sentry_checkin(headers)
        return DuplicateResult(holder, app=app)
    result = publish(app, entry, occurrence, actor=actor, extra_headers=extra_headers)
    if getattr(result, "deduplicated", False):  # a send of it is pending or running
        logger.info("%s %s: already sent as %s", entry.name, occurrence.label, result.id)
        _close_sentry_checkin(headers)
        return result
    _record_sent(task, occurrence, result.id, actor)
    logger.info("%s %s: sent as %s", entry.name, occurrence.label, result.id)
    return result


def publish(
    app: Any,
    entry: Entry,
    occurrence: Occurrence,
    *,
    actor: str = "beat",
    extra_headers: dict[str, Any] | None = None,
) -> Any:
    """The publish step of ``send`` alone (nothing recorded as sent): deduplicated by the
    task's enqueue reservation of the occurrence's business key."""
    task = _task_of(app, entry)
    headers = {**(extra_headers or {}), **occurrence_headers(entry, occurrence, actor)}
    with _new_trace(entry, occurrence):
        result = task.apply_async(
            kwargs=entry.payload_for(occurrence),
            task_id=str(uuid.uuid4()),
            idempotency_key=occurrence.key,
            headers=headers,
        )
    if entry.overlap == "replace" and not getattr(result, "deduplicated", False):
        overlap.announce(task.store, entry.name, occurrence.at.isoformat())
    return result


def _new_trace(entry: Entry, occurrence: Occurrence) -> contextlib.AbstractContextManager[Any]:
    """Where this process traces, each occurrence is a trace of its own (its root span
    ``beat <entry>``), linked to the caller's span when a trigger runs inside one."""
    traces = spans.active()  # None unless this process traces: never imports OpenTelemetry
    if traces is None:
        return contextlib.nullcontext()
    attributes = {
        "task": entry.task, "schedule": entry.name, "occurrence": occurrence.at.isoformat(),
        "idempotency_key": occurrence.key,
    }  # fmt: skip
    return cast(
        "contextlib.AbstractContextManager[Any]",
        traces.new_trace(f"beat {entry.name}", attributes),
    )


def _record_sent(task: ConventionTask, occurrence: Occurrence, task_id: str, actor: str) -> None:
    """Mark the occurrence as sent, after its publish. Never raises: the job is
    published, and a send that finds no mark publishes again into the dedup."""
    record = {"task_id": task_id, "sender": actor, "at": schedules.now().isoformat()}
    try:
        task.store.put_state(sent_key(occurrence), record, SENT_KEEP)
    except Exception:
        logger.warning("%s: could not record as sent", occurrence.key, exc_info=True)


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
    return send(app, entry, entry.occurrence(found), actor=actor, manual=True)


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
