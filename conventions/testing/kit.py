"""The test kit of one test: the user's app, isolated, with a capture and a virtual clock.

``JobKit`` is what the ``cc_kit`` fixture gives a test (:mod:`conventions.testing.plugin`);
it can also be used without pytest::

    with JobKit.open(app, store_url="sqlite:///" + str(tmp / "store.db")) as kit:
        send_receipt.delay(order_id="ord_1")
        (run,) = kit.drain()
        assert run.outcome == "succeeded"

Inside the block the code under test publishes as usual (``.delay()``, ``send_task``,
the outbox relay, beat) and nothing reaches a broker: the kit captures each message and
runs it when asked, through the worker's run path, on the virtual clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from conventions.jobs import backoff
from conventions.store.base import Store
from conventions.store.records import AuditEvent, DeadLetter
from conventions.testing import helpers, schedules
from conventions.testing.capture import Capture, Published, task_name
from conventions.testing.clock import VirtualClock
from conventions.testing.drain import MAX_RUNS, drain
from conventions.testing.isolation import isolated
from conventions.testing.runner import Run, run_message
from conventions.tracing import context

#: the seed of the backoff jitter in a test (the same delays on every run)
DEFAULT_SEED = 0


class JobKit:
    """Run, capture, drain and schedule the jobs of ``app`` in one test."""

    def __init__(self, app: Any, store: Store, capture: Capture, trace: context.Trace) -> None:
        self.app = app
        self.store = store
        self.capture = capture
        self.clock: VirtualClock = capture.clock
        #: the correlation context the test's own publishes carry (as a web request's)
        self.trace = trace

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        app: Any,
        *,
        store_url: str,
        start: datetime | None = None,
        seed: int | None = DEFAULT_SEED,
    ) -> Iterator[JobKit]:
        """The kit for ``app`` with its store at ``store_url`` (a SQLite file or a Redis
        database the test owns, emptied first), the clock at ``start``, and the backoff
        jitter seeded with ``seed`` (None: not seeded)."""
        clock = VirtualClock(start)
        state = backoff._RANDOM.getstate()
        if seed is not None:
            backoff._RANDOM.seed(seed)
        try:
            with isolated(app, store_url, clock) as store, context.bind() as trace:
                capture = Capture(app, clock)
                clock.before_move.append(capture.collect)
                capture.open()
                try:
                    yield cls(app, store, capture, trace)
                finally:
                    capture.close()
        finally:
            backoff._RANDOM.setstate(state)

    # -- what was published -------------------------------------------------------------
    def enqueued(self, task: Any = None, **payload: Any) -> list[Published]:
        """The messages not run yet (of ``task``, with these payload fields)."""
        return self.capture.find(task, pending_only=True, **payload)

    def published(self, task: Any = None, **payload: Any) -> list[Published]:
        """Every message published in this test, run or not, in order."""
        return self.capture.find(task, **payload)

    def assert_enqueued(self, task: Any, count: int = 1, **payload: Any) -> list[Published]:
        """Exactly ``count`` messages of ``task`` (with these payload fields) wait to run."""
        found = self.enqueued(task, **payload)
        if len(found) != count:
            raise AssertionError(
                f"expected {count} enqueued {task_name(task)} with {payload or 'any payload'}"
                f", found {len(found)}: {self._listing()}"
            )
        return found

    def assert_not_enqueued(self, task: Any = None, **payload: Any) -> None:
        """No message of ``task`` (with these payload fields; any task: None) waits."""
        found = self.enqueued(task, **payload)
        if found:
            raise AssertionError(
                f"expected no enqueued {task_name(task) or 'job'} with "
                f"{payload or 'any payload'}, found {len(found)}: {self._listing()}"
            )

    def _listing(self) -> str:
        items = [f"{p.name}{p.payload}" for p in self.capture.pending]
        return "[" + ", ".join(items) + "]" if items else "nothing enqueued"

    def dedup_hits(self, task: Any = None) -> int:
        """How many publishes were answered with an existing job (``deduplicated``)."""
        name = task_name(task)
        return sum(
            count for (event, of), count in self.store.counters().items()
            if event == "deduplicated" and (name is None or of == name)
        )  # fmt: skip

    def relay_outbox(self, engine: Any) -> int:
        """Run the outbox relay once over ``engine`` (the app's own database), as
        ``conventions outbox relay --once`` does: the rows committed so far are published
        (and captured); returns how many."""
        from conventions.transactional.relay import Relay

        relay = Relay(self.app, engine)
        try:
            return relay.drain().published
        finally:
            relay.release()

    # -- running ------------------------------------------------------------------------
    def run(self, task: Any, /, **payload: Any) -> Run:
        """Publish ``task`` (a task or its name) with ``payload`` (as ``.delay()`` does)
        and run that message now, through the worker's path; what it publishes waits
        (see ``drain``)."""
        if isinstance(task, str):
            task = self.app.tasks[task]
        result = task.apply_async(kwargs=payload)
        if getattr(result, "deduplicated", False):
            raise AssertionError(
                f"{task.name}{payload} was deduplicated against {result.id}: nothing to run"
            )
        (job,) = [item for item in self.enqueued(task) if item.task_id == result.id]
        return self.run_job(job)

    def run_job(self, job: Published) -> Run:
        """Run one captured message now (whatever its ETA)."""
        return run_message(self.app, self.capture, self.store, job)

    def drain(
        self,
        task: Any = None,
        *,
        max_runs: int = MAX_RUNS,
        until: datetime | float | None = None,
        strict: bool = True,
    ) -> list[Run]:
        """Run what is enqueued, and what that publishes, until nothing is left (see
        :func:`conventions.testing.drain.drain`): retries and countdowns on the clock."""
        return drain(
            self.app, self.capture, self.store,
            task=task, max_runs=max_runs, until=until, strict=strict,
        )  # fmt: skip

    def run_batch(self, batch: Any, *, max_runs: int = MAX_RUNS) -> Any:
        """Submit ``batch`` (``app.batch(...)``) and drain: its members, their retries on
        the virtual clock, and the callbacks its end publishes, all through the run
        path; answers the batch's :class:`~conventions.store.batches.BatchStatus`."""
        submitted = batch.submit()
        self.drain(max_runs=max_runs)
        return self.store.get_batch(submitted.id)

    # -- what the layer wrote ---------------------------------------------------------------
    def dead_letters(self, task: Any = None) -> list[DeadLetter]:
        """The dead letters of this test (of ``task``), newest first."""
        return self.store.list_dead_letters(task=task_name(task), limit=1000)

    def events(self, job: Published | Run | str | None = None) -> list[AuditEvent]:
        """The audit events of a job (a message, a run or a task id), or of every job
        this test published, oldest first."""
        if isinstance(job, Run):
            job = job.job
        correlations = {self.trace.correlation_id}
        correlations.update(p.correlation_id for p in self.capture if p.correlation_id)
        found = [event for c in sorted(correlations) for event in self.store.audit_for(c)]
        found.sort(key=lambda event: event.at)
        if job is None:
            return found
        task_id = job if isinstance(job, str) else job.task_id
        return [event for event in found if event.task_id == task_id]

    # -- schedules ------------------------------------------------------------------------
    def run_schedule(
        self,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        entries: list[str] | None = None,
        run_jobs: bool = False,
    ) -> list[schedules.Sent]:
        """Beat for this much virtual time (see :mod:`conventions.testing.schedules`):
        every entry but the watchdog's, or those ``entries`` names."""
        duration = timedelta(days=days, hours=hours, minutes=minutes)
        return schedules.run_schedule(
            self.app, self.capture, self.store, duration, entries=entries, run_jobs=run_jobs
        )

    def watchdog_alarms(self) -> list[dict[str, Any]]:
        """The watchdog's check at the virtual now: the alarms it raised."""
        return schedules.alarms(self.app)

    # -- helpers for long jobs ----------------------------------------------------------------
    def stopping(self) -> contextlib.AbstractContextManager[None]:
        """Within the block, ``ctx.is_stopping()`` is true, as in a warm shutdown."""
        return helpers.stopping()

    def checkpoint(self, key: str) -> Any:
        """The checkpoint a job saved under its idempotency key (None: none)."""
        return helpers.checkpoint_of(self.store, key)

    def progress(self, job: Published | Run) -> dict[str, Any] | None:
        """The last progress a job reported (``ctx.progress``)."""
        task_id = job.job.task_id if isinstance(job, Run) else job.task_id
        return helpers.progress_of(self.store, task_id)


__all__ = ["DEFAULT_SEED", "JobKit"]
