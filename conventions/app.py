"""The Celery app of a project that uses the layer, and the ``@app.job`` decorator.

``App`` is a ``Celery`` subclass: Celery still does the running. It adds the decorator
that declares a convention task (checked at definition time: a bad declaration fails
at import with an error that says the fix), the layer's store, and one choke point for
publishing: ``send_task`` of a registered convention task by name validates exactly like
``.delay()``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, TypeVar, cast

from celery import Celery

from conventions.batches.declare import Batch
from conventions.capacity import backpressure
from conventions.config import settings
from conventions.config.capacity import check_uses
from conventions.errors import ConfigurationError
from conventions.jobs import priority as jobpriority
from conventions.jobs import routing
from conventions.jobs.backoff import Backoff
from conventions.jobs.contract import Contract, KeyTemplate
from conventions.jobs.decisions import DEFAULT_TABLE, Decision, DecisionTable
from conventions.jobs.payloads import Payload
from conventions.observability import runs
from conventions.store import Store, open_store
from conventions.task import ConventionTask, template_fields
from conventions.tracing.headers import READY
from conventions.transport import amqp_queues
from conventions.worker import job_context as joblib
from conventions.worker.wiring import Wiring

#: ``domain.action.vN``: lower-case words, a version from 1
NAME = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*\.v[1-9][0-9]*$")

F = TypeVar("F", bound=Callable[..., Any])


def check_definition(
    app: Celery, name: str, payload: Any, key: Any, workload: str, *, time_limit: float | None
) -> None:
    """Refuse a bad task declaration, saying how to fix it."""
    if not NAME.match(name):
        raise ConfigurationError(
            f"task name {name!r} must look like 'domain.action.vN' (e.g. "
            "'email.send_receipt.v1'): lower-case words and a version, so a changed "
            "payload ships as a new name"
        )
    if not (isinstance(payload, type) and issubclass(payload, Payload)):
        raise ConfigurationError(
            f"{name}: payload= must be a conventions.Payload subclass, got {payload!r}"
        )
    if isinstance(key, str):
        fields = template_fields(key)
        unknown = [f for f in fields if f not in payload.model_fields]
        if not fields or unknown:
            raise ConfigurationError(
                f"{name}: idempotency key template {key!r} must name payload fields only "
                f"(unknown: {unknown or 'none named'}); fields are "
                f"{sorted(payload.model_fields)}, e.g. key='receipt:{{order_id}}'"
            )
    elif not callable(key):
        raise ConfigurationError(
            f"{name}: key= is required: a template over payload fields like "
            "'receipt:{order_id}', or a callable of the payload"
        )
    known = routing.workloads(app.conf)
    if workload not in known:
        raise ConfigurationError(
            f"{name}: workload {workload!r} is unknown; known workloads are "
            f"{sorted(known)} (add it to conventions_workloads in celeryconfig.py)"
        )
    if time_limit is not None and time_limit <= 0:
        raise ConfigurationError(f"{name}: time_limit must be positive seconds")


def check_exclusive(name: str, payload: type[Payload], exclusive: str | None) -> None:
    """An ``exclusive=`` lock template must name payload fields only."""
    if exclusive is None:
        return
    fields = template_fields(exclusive) if isinstance(exclusive, str) else []
    unknown = [f for f in fields if f not in payload.model_fields]
    if not fields or unknown:
        raise ConfigurationError(
            f"{name}: exclusive lock template {exclusive!r} must name payload fields only "
            f"(unknown: {unknown or 'none named'}); fields are {sorted(payload.model_fields)}, "
            "e.g. exclusive='customer:{customer_id}'"
        )


def refuse_unknown_version(name: str, registered: Mapping[str, Any]) -> None:
    """Refuse ``domain.action.vN`` when this app registers ``domain.action`` at other
    versions only: a typo or a version skew, which a worker would dead-letter later.

    Nothing is published. A family this app does not register at all is left alone:
    ``send_task`` is also how an app publishes to tasks that only another app registers.
    """
    if not NAME.match(name):
        return
    family = name.rpartition(".")[0]
    versions = sorted(
        (other for other, task in registered.items()
         if isinstance(task, ConventionTask) and other.rpartition(".")[0] == family),
        key=lambda other: int(other.rpartition(".v")[2]),
    )  # fmt: skip
    if versions:
        known = ", ".join(other.rpartition(".")[2] for other in versions)
        raise ConfigurationError(
            f"{name} is not registered in this app, which registers {family} as {known}: "
            "nothing was published. Publish a registered version, or register this one "
            "in this app first (docs/howto/ship-a-v2.md)"
        )


class App(Celery):  # type: ignore[misc]
    """A Celery app with the layer's conventions."""

    def on_init(self) -> None:
        """Celery's hook at the end of ``__init__``: connect this app's own signal
        handlers (:mod:`conventions.worker.wiring`; nothing is connected at import)."""
        super().on_init()
        self._cc_wiring = Wiring(self)
        self._cc_wiring.connect()
        # what Celery shows of the settings (celery report, inspect conf) masks every
        # URL's password, the layer's settings included; the values are untouched (the
        # settings view stores attributes as settings: hence object.__setattr__)
        object.__setattr__(self._conf, "__class__", settings.MaskedSettings)

    def job(
        self,
        name: str | Contract,
        *,
        payload: type[Payload] | None = None,
        key: KeyTemplate | None = None,
        workload: str | None = None,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        replayable: bool = True,
        dedup: str | float | None = "until_done",
        backoff: Backoff | None = None,
        errors: DecisionTable | Mapping[type[BaseException], str | Decision] | None = None,
        reconcile: Callable[..., Any] | None = None,
        exclusive: str | None = None,
        uses: tuple[str, ...] = (),
        overflow: str = "raise",
        key_override: bool = False,
        keep_logs: bool = False,
        priority: str | None = None,
    ) -> Callable[[Callable[..., Any]], ConventionTask]:
        """Declare a convention task: ``@app.job("email.send_receipt.v1", payload=...,
        key="receipt:{order_id}", workload="email")`` over ``def body(payload, ctx)``.

        ``exclusive="customer:{customer_id}"``: at most one job per lock runs at a time
        across workers (``conventions.capacity.locks``); a delivery that finds it taken is deferred.

        ``key_override=True``: a call may give the key (``idempotency_key=``) and the
        worker takes the one the message carries; off (the default), the key is always
        the one ``key`` derives from the payload (docs/howto/idempotency.md).

        ``priority="high"``: its messages' level (high, normal, low) over its
        workload's (``conventions_workload_priorities``; :mod:`conventions.jobs.priority`).

        ``keep_logs=True``: the log lines of each run are kept, scrubbed and capped, in its
        run record (``conventions.observability.runs.keep_logs``; the console's run page).

        ``@app.job(CONTRACT, backoff=...)``: the name, payload, key, workload and publish
        options come from a :class:`~conventions.jobs.contract.Contract` the web process
        shares (:meth:`publisher`); the other options are the worker's.
        """
        if isinstance(name, Contract):
            if payload is not None or key is not None or workload is not None:
                raise ConfigurationError(
                    f"{name.name}: the contract declares the payload, key and workload; "
                    "give them once, in the Contract"
                )
            contract = name
            if dedup != "until_done" or key_override or overflow != "raise":
                raise ConfigurationError(
                    f"{contract.name}: dedup, key_override and overflow change what a "
                    "publish does: declare them in the Contract, which the publisher shares"
                )
            if priority is not None:  # the publisher has only the Contract
                raise ConfigurationError(f"{contract.name}: {jobpriority.NOT_IN_CONTRACT}")
            name, payload, key, workload = (
                contract.name, contract.payload, contract.key, contract.workload
            )  # fmt: skip
            dedup, key_override, overflow = (
                contract.dedup, contract.key_override, contract.overflow
            )  # fmt: skip
        if payload is None or key is None or workload is None:
            raise ConfigurationError(
                f"{name}: payload=, key= and workload= are required (or declare the job "
                "from a Contract: @app.job(CONTRACT))"
            )
        check_definition(self, name, payload, key, workload, time_limit=time_limit)
        check_exclusive(name, payload, exclusive)
        priority_level = jobpriority.check_level(name, priority, self.conf)
        if dedup not in ("until_done", "forever", None) and not isinstance(dedup, int | float):
            raise ConfigurationError(
                f"{name}: dedup must be 'until_done', 'forever', a TTL in seconds, or None"
            )
        table = DEFAULT_TABLE
        if isinstance(errors, DecisionTable):
            table = errors
        elif errors:
            table = DEFAULT_TABLE.extend(errors)
        conf = settings.read(self.conf)
        check_uses(name, tuple(uses), conf.limits)
        if overflow not in backpressure.POLICIES:
            raise ConfigurationError(f"{name}: overflow must be 'raise' or 'shed'")
        hard = float(
            time_limit or conf.workload_time_limits.get(workload) or conf.default_time_limit
        )
        soft = float(soft_time_limit or max(hard - max(5.0, hard * 0.1), hard * 0.5))
        options: dict[str, Any] = {
            "payload": payload,
            "key": staticmethod(key) if callable(key) else key,
            "workload": workload,
            "time_limit": hard,
            "soft_time_limit": soft,
            "replayable": replayable,
            "dedup": dedup,
            "backoff": backoff or Backoff(),
            "decisions": table,
            "reconcile": staticmethod(reconcile) if reconcile else None,
            "exclusive": exclusive,
            "uses": tuple(uses),
            "overflow": overflow,
            "key_override": bool(key_override),
            "priority_level": priority_level,
        }

        def decorate(fun: Callable[..., Any]) -> ConventionTask:
            existing = self._tasks.get(name)
            if existing is not None and getattr(existing, "publisher_only", False):
                self._tasks.unregister(name)  # the body takes the publisher's place
            task = self.task(name=name, base=ConventionTask, lazy=False, shared=False, **options)(
                fun
            )
            if keep_logs:
                runs.keep_logs(task)
            return cast(ConventionTask, task)

        return decorate

    def batch(self, key: str, *, on_success: Any = None, on_complete: Any = None) -> Batch:
        """A batch of convention jobs whose callbacks run once, after every member has
        ended: ``on_complete`` when all ended, ``on_success`` when all succeeded (a
        dead-lettered member that is replayed and succeeds counts then). Each callback is
        ``task.s(**fields)`` of a job whose payload has a ``batch_id`` field. ``key`` is
        the batch's idempotency key: submitting it again makes no second batch.
        See :mod:`conventions.batches.declare` and the batches how-to."""
        return Batch(self, key, on_success=on_success, on_complete=on_complete)

    def publisher(self, contract: Contract) -> ConventionTask:
        """The publish side of ``contract``: a task whose ``.delay()``/``apply_async``
        validate, key, deduplicate and set headers as the job's own do, registered in
        this app without the job's body (a web process imports the contract only).

        When this app registers the job itself (``@app.job``), that task is returned. A
        publisher's body never runs: a worker with no body for the job dead-letters it
        as a bug, with the reason.
        """
        registered = self._tasks.get(contract.name)
        if isinstance(registered, ConventionTask):
            return registered
        name = contract.name

        def body(payload: Payload, ctx: joblib.JobContext) -> Any:
            raise ConfigurationError(
                f"{name} reached a worker that has its contract but not its body: declare "
                "the body with @app.job in the app the worker runs (-A)"
            )

        body.__name__ = f"{name.replace('.', '_')}_publisher"
        body.__module__ = __name__
        declare = self.job(contract)
        task = declare(body)
        type(task).publisher_only = True
        return task

    def upcaster(
        self, name: str, *, payload: type[Payload], into: ConventionTask
    ) -> Callable[[Callable[[Any], Payload]], ConventionTask]:
        """Keep an old version registered while its queue drains: its messages are
        converted to the new payload and run by the new version's body."""
        check_definition(self, name, payload, into.key, into.workload, time_limit=None)

        def decorate(convert: Callable[[Any], Payload]) -> ConventionTask:
            def body(payload: Payload, ctx: joblib.JobContext) -> Any:  # pragma: no cover
                raise ConfigurationError("an upcaster's body is never called")

            body.__name__ = convert.__name__
            body.__module__ = convert.__module__
            options: dict[str, Any] = {
                "payload": payload,
                "key": into.key,
                "workload": into.workload,
                "time_limit": into.time_limit,
                "soft_time_limit": into.soft_time_limit,
                "replayable": into.replayable,
                "dedup": into.dedup,
                "backoff": into.backoff,
                "decisions": into.decisions,
                "exclusive": into.exclusive,
                "key_override": into.key_override,
                "upcast": staticmethod(convert),
                "upcast_into": into,
            }
            return cast(
                ConventionTask,
                self.task(name=name, base=ConventionTask, lazy=False, shared=False, **options)(
                    body
                ),
            )

        return decorate

    @cached_property
    def amqp(self) -> Any:
        """Celery's AMQP part, made once the configuration is in: the workloads' queues and
        routes are declared first, when the app declares none of its own."""
        self._route_workloads()
        return super().amqp

    def _route_workloads(self) -> None:
        """``task_queues`` and ``task_routes`` from ``conventions_workloads`` when unset:
        a durable queue per workload queue plus the default queue (plain tasks), and the
        router that sends each job to its workload's queue. Set either yourself and it is
        kept as it is."""
        conf = self.conf
        mapping = routing.workloads(conf)
        if conf.get("task_queues") is None:
            default = conf.get("task_default_queue") or "celery"
            names = {**mapping, "": default}
            quorum = settings.quorum_queues(conf)  # RabbitMQ, through the reliable profile
            conf.task_queues = (
                amqp_queues.workload_queues(conf, names) if quorum else routing.queues_for(names)
            )
        if not conf.get("task_routes"):
            conf.task_routes = (routing.WorkloadRouter(mapping),)

    @cached_property
    def conventions_settings(self) -> settings.Settings:
        return settings.read(self.conf)

    @property
    def store(self) -> Store:
        """The layer's store (opened lazily, once per process). Opening it connects to
        nothing (the SQL store creates its tables at first use): a store that does not
        answer fails that first call, which the run path turns into a defer, rather than
        this property, read where Celery would mark the job FAILURE."""
        current = self.__dict__.get("_cc_store")
        if current is None:
            url = self.conventions_settings.store_url
            if not url:
                raise ConfigurationError(
                    "conventions_store_url is not set: point it at Redis (redis://...) or "
                    "SQL (postgresql://..., sqlite:///...) in celeryconfig.py"
                )
            current = open_store(url, **settings.store_options(self.conventions_settings))
            self.__dict__["_cc_store"] = current
        return cast(Store, current)

    def reset_store(self) -> None:
        """Forget the store (after fork, each process opens its own connections)."""
        self.__dict__.pop("_cc_store", None)

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Publish by name; a registered convention task validates like ``.delay()``.

        A name this app does not register is published as Celery would (a task of
        another app, run by workers elsewhere), unless it is another version of a task
        this app registers: that is refused (:func:`refuse_unknown_version`).
        """
        if options.pop(READY, False):
            return self._send(name, args, kwargs, options)
        registered = self.tasks if self.finalized else self._tasks
        task = registered.get(name)
        if isinstance(task, ConventionTask):
            options.pop("task_type", None)
            return task.apply_async(args, kwargs, **options)
        if task is None:
            refuse_unknown_version(name, registered)
        return self._send(name, args, kwargs, options)

    def _send(self, name: str, args: Any, kwargs: Any, options: dict[str, Any]) -> Any:
        """Celery's publish. On RabbitMQ's quorum queues, with the topology declared once
        (``amqp_queues.ensure``); with publisher confirms, ``mandatory`` and a bounded
        confirm wait, a message the broker routes nowhere raised as
        :class:`~conventions.errors.Unroutable` (without confirms a ``basic.return``
        would surface in a later, unrelated call: ``mandatory`` is left off then)."""
        conf = self.conf
        if not settings.is_amqp(conf):
            return super().send_task(name, args, kwargs, **options)
        if settings.quorum_queues(conf):
            amqp_queues.ensure(self)
            amqp_queues.whole_second_delay(options)
        if not amqp_queues.confirms(conf):
            return super().send_task(name, args, kwargs, **options)
        for option, value in (
            ("mandatory", True),  # Celery passes None: RabbitMQ would drop an unroutable
            ("confirm_timeout", self.conventions_settings.publish_timeout),
        ):
            if options.get(option) is None:
                options[option] = value
        try:
            return super().send_task(name, args, kwargs, **options)
        except Exception as exc:
            unroutable = amqp_queues.unroutable(exc, name)
            if unroutable is None:
                raise
            raise unroutable from exc
