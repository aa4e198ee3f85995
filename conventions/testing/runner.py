"""Run one published message as a worker would, in this process, and say what happened.

The message is the one the code published (:mod:`conventions.testing.capture`), and it
runs the way a worker runs it: Celery's own worker ``Request`` reads it (our headers
become ``task.request`` attributes, the delivery info names its queue) and a tracer
Celery builds as its worker does (``build_tracer``, not eager) calls the task, so the
whole run path of the layer is the one under test: payload validation, idempotency key,
ledger claim, decisions table, retry, deferral, dead letter, audit events, result states.

What the delivery published (its retry with the countdown, a deferral, child jobs) is
captured like any publish and waits for the test or ``drain``: a retry never runs in
place, as it would in eager mode. The outcome is read from what the layer wrote: the
audit events of this delivery and its dead-letter record.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery import states
from celery.app.trace import build_tracer
from celery.exceptions import Reject, Retry
from celery.worker.request import Request

from conventions.store.base import Store
from conventions.store.records import AuditEvent, DeadLetter
from conventions.testing.capture import Capture, Published

#: the worker name the kit's deliveries run under
HOSTNAME = f"testkit@{socket.gethostname()}"
#: the events that end a delivery, by precedence (the first found names the outcome)
OUTCOMES = (
    "dead_lettered",
    "quarantined",
    "retried",
    "retry_failed",
    "deferred",
    "skipped_duplicate",
    "skipped",
    "shed",
    "succeeded",
)


class NotRegistered(LookupError):
    """A captured message of a task the app under test does not register."""


@dataclass
class Run:
    """One delivery of one job, and what it ended as.

    ``outcome`` is one of ``succeeded``, ``retried``, ``deferred``, ``dead_lettered``,
    ``skipped_duplicate`` (its key was already done), ``skipped`` (``SkipJob``),
    ``quarantined``, ``requeued`` (the outcome could not be recorded: the message is
    delivered again), or, when the layer wrote none of those, Celery's state in lower case.
    """

    job: Published
    outcome: str
    #: Celery's state of the delivery (``SUCCESS``, ``RETRY``, ``FAILURE``, ``IGNORED``, ...)
    state: str
    #: what the body returned (``succeeded`` only)
    value: Any
    #: the body's exception (a retry's or a dead letter's), if any
    exception: BaseException | None
    #: the audit events this delivery wrote, in order
    events: list[AuditEvent]
    #: what this delivery published: its retry, a deferral, child jobs
    published: list[Published]
    #: the virtual time it ran at
    ran_at: datetime
    dead_letter: DeadLetter | None = field(default=None, repr=False)

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def delay(self) -> float | None:
        """The countdown of the retry or deferral this delivery published (seconds)."""
        for item in self.published:
            if item.task_id == self.job.task_id:
                return item.countdown
        return None

    @property
    def category(self) -> str | None:
        """The dead letter's category (``permanent``, ``invalid``, ``bug``, ``exhausted``...)."""
        return str(self.dead_letter.category) if self.dead_letter is not None else None

    @property
    def reason(self) -> str | None:
        """Why it ended so: the dead letter's message, or the retry's / deferral's reason."""
        if self.dead_letter is not None:
            return self.dead_letter.message
        for event in reversed(self.events):
            if "reason" in event.detail:
                return str(event.detail["reason"])
        return None

    @property
    def event_names(self) -> list[str]:
        return [event.event for event in self.events]


def _trail(store: Store, job: Published) -> list[AuditEvent]:
    return store.audit_for(job.correlation_id) if job.correlation_id else []


def _mine(event: AuditEvent, job: Published) -> bool:
    return event.task_id == job.task_id


def _outcome(events: list[AuditEvent], state: str) -> str:
    names = {event.event for event in events}
    for name in OUTCOMES:
        if name in names:
            return name
    return state.lower()


def _exception_of(info: Any) -> BaseException | None:
    if info is None:
        return None
    exc = info.retval if isinstance(info.retval, BaseException) else None
    if isinstance(exc, Retry):
        return exc.exc if isinstance(exc.exc, BaseException) else exc
    return exc


def _requeued(info: Any) -> bool:
    """Whether the delivery ended with ``Reject(requeue=True)`` (the store or the broker
    did not take its outcome): a worker leaves the message to the broker again."""
    exc = getattr(info, "retval", None)
    return isinstance(exc, Reject) and bool(exc.requeue)


def _dead_letter(store: Store, job: Published, events: list[AuditEvent]) -> DeadLetter | None:
    for event in events:
        record_id = event.detail.get("dead_letter_id")
        if event.event == "dead_lettered" and record_id:
            return store.get_dead_letter(str(record_id))
    return None


def run_message(app: Any, capture: Capture, store: Store, job: Published) -> Run:
    """Run the captured message ``job`` through the app's worker path; ``job`` leaves the
    pending messages, and what the run publishes joins them."""
    task = app.tasks.get(job.name)
    if task is None:
        raise NotRegistered(
            f"{job.name} is not registered in {app.main}: a message for another app's "
            "workers (its test kit runs it)"
        )
    if job in capture.pending:
        capture.take(job)
    capture.collect()  # anything published before the run is not the run's
    before = len(_trail(store, job))
    request = Request(job.message, app=app, hostname=HOSTNAME, task=task)
    args, kwargs, embed = job.message.decode()
    request_dict = request.request_dict
    request_dict.update({"loglevel": None, "logfile": None, "is_eager": False}, **(embed or {}))
    ran_at = capture.clock.now()
    # a tracer of its own, as a worker builds one (``task.__trace__`` stays the worker's)
    tracer = build_tracer(task.name, task, loader=app.loader, hostname=HOSTNAME, app=app)
    retval, info, _, _ = tracer(job.task_id, args, kwargs, request_dict)
    published = capture.collect()
    events = [event for event in _trail(store, job)[before:] if _mine(event, job)]
    state = info.state if info is not None else states.SUCCESS
    outcome = _outcome(events, state)
    if _requeued(info):  # given back to the broker unacked: delivered again
        capture.pending.append(job)
        outcome = "requeued"
    return Run(
        job=job,
        outcome=outcome,
        state=state,
        value=retval if info is None else None,
        exception=_exception_of(info),
        events=events,
        published=published,
        ran_at=ran_at,
        dead_letter=_dead_letter(store, job, events),
    )
