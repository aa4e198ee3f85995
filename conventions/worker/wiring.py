"""The Celery signal handlers an :class:`~conventions.app.App` connects for itself.

Nothing in the layer connects a handler, replaces the log record factory or opens a
connection at import. An app connects its receivers when it is created
(``App.on_init``), once, under dispatch uids of its own; Celery keeps them as weak
references to a :class:`Wiring` the app holds, so they go with the app. Each receiver
returns at once for a sender of another app:

- a publish (``before_task_publish``; ``after_task_publish`` only where
  ``opentelemetry-instrumentation-celery`` is installed): the task name is registered
  in this app;
- a run (``task_prerun``, ``task_postrun``, ``task_revoked``): ``task.app`` is this app;
- a worker or beat start (``worker_init``, ``worker_ready``, ``worker_shutdown``,
  ``beat_init``): the sender's app is this app, which then *owns the process*;
- what Celery sends without an app (``worker_shutting_down``, ``after_setup_logger``):
  only the app that owns the process acts (before a start, the current app: beat sets up
  logging before ``beat_init``); after a fork (``worker_process_init``) every app forgets
  its own store, nothing else.

So two apps in one process never run each other's hooks.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app, signals

from conventions.batches import callbacks as batch_callbacks
from conventions.config import settings
from conventions.errors import ConfigurationError
from conventions.observability import alerts
from conventions.ops import retention
from conventions.tracing import logs, spans
from conventions.transport import amqp_queues
from conventions.worker import lifecycle, poison_queue, queue_pauses, reservations, signal_wake
from conventions.worker import signals as handlers

logger = logging.getLogger("conventions.worker.wiring")

#: the app whose worker or beat runs in this process (set by its start signal; the last
#: one started when a process starts several, as a test run does)
_owner: list[Any] = []


def owner() -> Any:
    """The app that runs this process's worker or beat, else None."""
    return _owner[-1] if _owner else None


class Wiring:
    """One app's receivers (the app holds it; Celery holds them weakly)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def connect(self) -> None:
        uid = f"conventions:{id(self.app)}:"
        for signal, receiver in (
            (signals.before_task_publish, self.before_publish),
            (signals.task_prerun, self.prerun),
            (signals.task_postrun, self.postrun),
            (signals.task_revoked, self.revoked),
            (signals.worker_init, self.worker_init),
            (signals.worker_ready, self.worker_ready),
            (signals.worker_shutdown, self.worker_shutdown),
            (signals.worker_shutting_down, self.shutting_down),
            (signals.worker_process_init, self.process_init),
            (signals.beat_init, self.beat_init),
            (signals.after_setup_logger, self.setup_logger),
            (signals.after_setup_task_logger, self.setup_logger),
        ):
            signal.connect(receiver, weak=True, dispatch_uid=uid + receiver.__name__)
        if spans.instrumentation_installed():
            signals.after_task_publish.connect(
                self.after_publish, weak=True, dispatch_uid=uid + "after_publish"
            )

    # -- whose is it -------------------------------------------------------------------
    def _runs_here(self) -> bool:
        app = owner()
        if app is not None:
            return app is self.app
        return current_app._get_current_object() is self.app

    def _mine(self, sender: Any) -> bool:
        return getattr(sender, "app", None) is self.app

    def _start(self) -> None:
        _owner[:] = [self.app]
        logs.install()

    # -- publish and run ---------------------------------------------------------------
    def before_publish(
        self, sender: Any = None, headers: Any = None, routing_key: Any = None, **_: Any
    ) -> None:
        if isinstance(sender, str) and sender in self.app._tasks:
            handlers.on_before_publish(
                headers=headers, task=self.app._tasks[sender], routing_key=routing_key
            )

    def after_publish(
        self, sender: Any = None, headers: Any = None, routing_key: Any = None, **_: Any
    ) -> None:
        if isinstance(sender, str) and sender in self.app._tasks:
            handlers.on_after_publish(
                headers=headers, task=self.app._tasks[sender], routing_key=routing_key
            )

    def prerun(self, sender: Any = None, task_id: Any = None, task: Any = None, **_: Any) -> None:
        if self._mine(task):
            handlers.on_prerun(task_id=task_id, task=task)

    def postrun(self, sender: Any = None, task: Any = None, **_: Any) -> None:
        if self._mine(task):
            handlers.on_postrun(task=task)

    def revoked(self, sender: Any = None, **kwargs: Any) -> None:
        if self._mine(sender) and getattr(sender, "conventions_job", False):
            reservations.on_revoked(sender=sender, **kwargs)

    # -- worker and beat ---------------------------------------------------------------
    def worker_init(self, sender: Any = None, **_: Any) -> None:
        if not self._mine(sender):
            return
        self._start()
        _init_sentry(self.app)
        lifecycle.on_worker_init(sender)
        queue_pauses.on_init(self.app, sender)  # its own queues, the resume command
        _declare_amqp_topology(self.app)

    def worker_ready(self, sender: Any = None, **_: Any) -> None:
        if self._mine(sender):
            signal_wake.install(getattr(getattr(sender, "controller", None), "hub", None))
            retention.start(self.app)
            batch_callbacks.start(self.app)  # publishes the callbacks a crash left due
            queue_pauses.start(self.app, sender)  # sender: the consumer
            # RabbitMQ's quorum queues: the poison queue's consumer (else nothing)
            poison_queue.start(self.app, getattr(sender, "hostname", None))

    def worker_shutdown(self, sender: Any = None, **_: Any) -> None:
        if self._mine(sender):
            signal_wake.uninstall()
            retention.stop(self.app)
            batch_callbacks.stop(self.app)
            queue_pauses.stop(self.app, str(getattr(sender, "hostname", "")))
            poison_queue.stop(self.app)

    def shutting_down(self, sender: Any = None, how: Any = None, **_: Any) -> None:
        if self._runs_here():
            lifecycle.on_shutting_down(self.app, how=how)

    def process_init(self, sender: Any = None, **_: Any) -> None:
        # every app of a forked pool process forgets its own store (each process opens its
        # own connections): its own state only, whichever app runs the worker
        self.app.reset_store()
        signal_wake.after_fork()

    def beat_init(self, sender: Any = None, **_: Any) -> None:
        if self._mine(sender):
            self._start()
            _init_sentry(self.app)
            lifecycle.on_beat_init(self.app)

    def setup_logger(self, sender: Any = None, logger: Any = None, **_: Any) -> None:
        if self._runs_here() and logger is not None:
            logs.install()
            logs.configure(logger, self.app.conf.get("conventions_log_format") or "text")


def _declare_amqp_topology(app: Any) -> None:
    """On RabbitMQ's quorum queues, the queues, the poison queue and the delay exchanges
    declared before the consumer starts: Celery's delayed delivery binds the queues at
    its start and gives up (for the worker's life) on a vhost where nothing was
    published yet. A queue of the same name with other arguments stops the worker
    (``ConfigurationError``); a broker that does not answer yet is left to the first
    publish, which declares them too."""
    if not settings.quorum_queues(app.conf):
        return
    try:
        amqp_queues.ensure(app)
    except ConfigurationError:
        raise
    except Exception as exc:  # the broker is not there yet: the consumer retries it
        logger.warning("could not declare the RabbitMQ queues at start (%s): "
                       "the first publish declares them", exc)  # fmt: skip


def _init_sentry(app: Any) -> None:
    """Sentry when ``sentry_dsn`` is set. A bad DSN is logged, not raised: the worker
    (or beat) runs on without Sentry."""
    try:
        alerts.init_sentry(app.conf.get("sentry_dsn"))
    except Exception:
        alerts.logger.exception("could not initialise Sentry; running without it")
