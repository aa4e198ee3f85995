"""The Prometheus exporter: one process reads the broker and the store on each scrape.

Prefork-safe by construction: no worker process keeps a registry. What happened (jobs
published, started, retried, dead-lettered...; the wait and run histograms) is counted
by the store in the same step as each audit event (:mod:`conventions.store.counts`), from
every worker child at once; what is waiting is read from the broker (:mod:`queues`),
and with the layer's Redis transport what it holds beside the queues: delayed, in
inboxes, in flight, and the consumers alive (:mod:`conventions.ops.transport_view`).
On RabbitMQ the depth and consumers come from a passive declare; the oldest job's age
is not known there and its gauge is absent for a queue with jobs (never a made-up 0).
The exporter only reads, so a restart loses nothing and two exporters agree.

Names are ``celery_conventions_<noun>_total`` (counters), ``..._seconds`` (histograms
and ages) and plain gauges; the labels are ``queue`` and ``task`` only, never an id. A
task name the app does not register (a foreign producer's, a typo) is counted under
``task="other"``: whoever can publish cannot add label values without bound.
Every metric, when it moves and the alert that uses it: ``docs/reference/metrics.md``.

``/metrics`` has no authentication: the exporter listens on loopback unless told
otherwise (``--addr``, or ``conventions_metrics_addr``): see "Where the exporter listens"
in ``docs/reference/metrics.md``.

    conventions metrics serve --port 9808
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from conventions.config import extras
from conventions.jobs import routing
from conventions.observability import queues
from conventions.ops.transport_view import broker_reader
from conventions.store import counts

if TYPE_CHECKING:  # the 'metrics' extra; imported where the exporter runs
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector

logger = logging.getLogger("conventions.ops.exporter")

#: the namespace of every metric
NAMESPACE = "celery_conventions"
#: the port the exporter listens on by default
DEFAULT_PORT = 9808
#: the address it listens on by default: this machine only (``/metrics`` has no auth)
DEFAULT_ADDR = "127.0.0.1"
#: the ``task`` label of every task name the app does not register
OTHER_TASK = "other"
#: the default queue SLO (seconds a job may wait) when ``conventions_queue_slo_seconds``
#: does not name the queue
DEFAULT_SLO = 300.0
#: audit event -> counter (``celery_conventions_<noun>_total``)
EVENT_COUNTERS: Mapping[str, tuple[str, str]] = {
    "published": ("jobs_published", "jobs published to the broker (a duplicate is not)"),
    "deduplicated": ("jobs_deduplicated", "publishes answered with an existing job's handle"),
    "started": ("jobs_started", "deliveries that claimed their key and ran the body"),
    "retried": ("jobs_retried", "attempts that failed and were published again"),
    "deferred": ("jobs_deferred", "deliveries put back because their key was held"),
    "succeeded": ("jobs_succeeded", "bodies that returned"),
    "skipped": ("jobs_skipped", "jobs skipped by a Skip decision"),
    "skipped_duplicate": ("jobs_skipped_duplicate", "deliveries of a key already done"),
    "dead_lettered": ("jobs_dead_lettered", "jobs dead-lettered, every category"),
    "quarantined": ("jobs_quarantined", "poison jobs quarantined (also dead-lettered)"),
    "replayed": ("jobs_replayed", "dead letters replayed"),
    "publish_failed": ("jobs_publish_failed", "publishes the broker refused"),
    "retry_failed": ("jobs_retry_failed", "retries the broker refused (message requeued)"),
    "revoked": ("jobs_revoked", "jobs revoked before they ran (key given back)"),
    "expired": ("jobs_expired", "jobs whose expires had passed on receipt"),
    "watchdog_alarm": ("watchdog_alarms", "schedule expectations the watchdog found missed"),
}
HISTOGRAMS: Mapping[str, tuple[str, str]] = {
    counts.WAIT: ("job_wait_seconds", "time from due (publish or ETA) to start"),
    counts.RUN: ("job_run_seconds", "run time of the body, every outcome"),
}

#: gauge -> (labels, help)
GAUGES: Mapping[str, tuple[tuple[str, ...], str]] = {
    "broker_up": ((), "1 when the last broker read succeeded, else 0"),
    "queue_depth": (("queue",), "jobs waiting in the queue, every priority included"),
    "queue_oldest_age_seconds": (("queue",), "how long the oldest waiting job has been due"),
    "queue_priority_depth": (("queue", "priority"), "jobs waiting at one priority level"),
    "queue_priority_oldest_age_seconds": (("queue", "priority"), "oldest wait at one level"),
    "queue_consumers": (("queue",), "workers consuming the queue"),
    "queue_delayed": (("queue",), "jobs not yet due, in the transport's delayed set"),
    "queue_delayed_next_due_age_seconds": (
        ("queue",),
        "now minus the next delayed job's due time: negative while it is ahead, "
        "positive when it is overdue (nobody moved it)",
    ),
    "queue_in_flight": (("queue",), "jobs claimed by a worker and not yet acknowledged"),
    "queue_in_inboxes": (("queue",), "jobs fetched into a worker's inbox, not yet claimed"),
    "queue_consumers_alive": (("queue",), "consumers whose sign of life is fresh"),
    "queue_slo_seconds": (("queue",), "how long a job may wait in the queue (its SLO)"),
    "clock_skew_seconds": (
        ("queue",),
        "the clock of the live consumer of the queue farthest from the Redis server's, "
        "minus Redis' (its keeper measures it at every beat)",
    ),
    "store_up": ((), "1 when the last store read succeeded, else 0"),
    "dead_letters": ((), "dead-letter records kept in the store"),
    "outbox_lag_seconds": ((), "age of the oldest outbox row not published yet"),
}

OutboxLag = Callable[[], "float | None"]


def exported_names() -> set[str]:
    """Every sample name the exporter can show (for the rules and dashboard checks)."""
    names = {f"{NAMESPACE}_{gauge}" for gauge in GAUGES}
    names |= {f"{NAMESPACE}_{noun}_total" for noun, _ in EVENT_COUNTERS.values()}
    for noun, _ in HISTOGRAMS.values():
        names |= {f"{NAMESPACE}_{noun}_{part}" for part in ("bucket", "sum", "count")}
    return names


def queue_of_tasks(app: Any) -> dict[str, str]:
    """Task name -> queue, from each registered task's workload."""
    mapping = routing.workloads(app.conf)
    out: dict[str, str] = {}
    for name, task in app.tasks.items():
        workload = getattr(task, "workload", None)
        if workload is not None and workload in mapping:
            out[name] = mapping[workload]
    return out


def bind_address(app: Any, given: str | None = None) -> str:
    """Where the exporter listens: ``given`` (``--addr``), else the app's
    ``conventions_metrics_addr``, else loopback."""
    return str(given or app.conf.get("conventions_metrics_addr") or DEFAULT_ADDR)


def folded(counters: Mapping[tuple[str, str], int], known: set[str]) -> dict[tuple[str, str], int]:
    """``counters`` with every task name not in ``known`` counted as :data:`OTHER_TASK`
    (summed), so that foreign names cannot grow the label set."""
    out: dict[tuple[str, str], int] = {}
    for (name, task), value in counters.items():
        label = task if task in known else OTHER_TASK
        out[name, label] = out.get((name, label), 0) + value
    return out


def slos(app: Any, names: list[str]) -> dict[str, float]:
    """Each queue's SLO in seconds (``conventions_queue_slo_seconds``, else the default)."""
    configured = app.conf.get("conventions_queue_slo_seconds") or {}
    return {name: float(configured.get(name, DEFAULT_SLO)) for name in names}


def default_outbox_lag(app: Any) -> OutboxLag | None:
    """The outbox lag of ``conventions_outbox_url`` when it is set; else no outbox metric.

    A database without the outbox table yet (the web app never used the outbox) reads as
    no metric, not as an error on every scrape.
    """
    url = app.conf.get("conventions_outbox_url")
    if not url:
        return None
    extras.require("sqlalchemy", "sql", "the outbox lag metric")
    import sqlalchemy as sa

    from conventions.store.sql import make_engine
    from conventions.transactional import outbox

    engine = make_engine(str(url))

    def read() -> float | None:
        try:
            return outbox.lag(engine)
        except sa.exc.ProgrammingError:  # no outbox table (PostgreSQL)
            return None
        except sa.exc.OperationalError as exc:  # SQLite: no such table
            if "no such table" in str(exc):
                return None
            raise
        finally:
            engine.dispose()  # a scrape every 15 s or more: no connection kept between them

    return read


def load_callable(spec: str, app: Any) -> OutboxLag:
    """``MODULE:FUNC`` -> a callable of no argument that calls ``FUNC(app)``."""
    module_name, _, attr = spec.partition(":")
    function = getattr(importlib.import_module(module_name), attr or "lag")
    return lambda: function(app)


def _prometheus_client() -> None:
    """prometheus_client is there, or a ``MissingExtra`` naming the 'metrics' extra."""
    extras.require("prometheus_client", "metrics", "the Prometheus exporter")


class Exporter:
    """A prometheus_client collector: reads the broker and the store on each ``collect``.

    It needs the ``metrics`` extra (prometheus_client): constructing one without it is a
    ``MissingExtra`` naming the extra.
    """

    def __init__(
        self,
        app: Any,
        broker: queues.Reader | None = None,
        *,
        outbox_lag: OutboxLag | None = None,
        consumers_timeout: float = 1.0,
    ) -> None:
        _prometheus_client()
        self.app = app
        self.broker = broker or broker_reader(app)
        self.outbox_lag = outbox_lag
        self.consumers_timeout = consumers_timeout
        self.slos = slos(app, self.broker.queues)
        self.task_queues = queue_of_tasks(app)
        #: the task names that get a label of their own
        self.known_tasks = set(app.tasks) - {OTHER_TASK}
        self._consumers: dict[str, int] | None = None
        self._lock = threading.Lock()

    # -- consumers: a broadcast, refreshed in the background --------------------------
    def refresh_consumers(self) -> None:
        try:
            found = queues.consumers(self.app, self.consumers_timeout)
        except Exception:
            logger.exception("could not ask the workers for their queues")
            found = None
        with self._lock:
            self._consumers = found

    def watch_consumers(self, every: float, stop: threading.Event) -> threading.Thread:
        """Refresh the consumer counts every ``every`` seconds until ``stop`` is set."""

        def loop() -> None:
            while not stop.is_set():
                self.refresh_consumers()
                stop.wait(every)

        thread = threading.Thread(target=loop, name="cc-consumers", daemon=True)
        thread.start()
        return thread

    # -- collection ----------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        yield from self._queue_metrics()
        yield from self._store_metrics()
        yield from self._outbox_metrics()

    def _gauge(self, name: str) -> GaugeMetricFamily:
        from prometheus_client.core import GaugeMetricFamily

        labels, doc = GAUGES[name]
        return GaugeMetricFamily(f"{NAMESPACE}_{name}", doc, labels=list(labels))

    def _queue_metrics(self) -> Iterator[Metric]:
        up = self._gauge("broker_up")
        with self._lock:
            consumers = self._consumers
            try:
                states, ok = self.broker.read(consumers), 1
            except Exception:
                logger.exception("could not read the queues from the broker")
                states, ok = [], 0
        up.add_metric([], ok)
        depth, age = self._gauge("queue_depth"), self._gauge("queue_oldest_age_seconds")
        consumed, slo = self._gauge("queue_consumers"), self._gauge("queue_slo_seconds")
        for state in states:
            depth.add_metric([state.queue], state.depth)
            if state.oldest_age is not None or state.depth == 0:
                age.add_metric([state.queue], state.oldest_age or 0.0)
            if state.consumers is not None:
                consumed.add_metric([state.queue], state.consumers)
        for name, seconds in self.slos.items():
            slo.add_metric([name], seconds)
        yield from (up, depth, age, consumed, slo)
        yield from self._level_metrics(states)
        yield from self._held_metrics(states)

    def _level_metrics(self, states: list[queues.QueueState]) -> Iterator[Metric]:
        """Each priority level's depth and age: a starved level shows (absent with one step)."""
        depth = self._gauge("queue_priority_depth")
        age = self._gauge("queue_priority_oldest_age_seconds")
        for state in states:
            for level in state.levels:
                depth.add_metric([state.queue, level.priority], level.depth)
                if level.oldest_age is not None or level.depth == 0:
                    age.add_metric([state.queue, level.priority], level.oldest_age or 0.0)
        yield from (depth, age)

    def _held_metrics(self, states: list[queues.QueueState]) -> Iterator[Metric]:
        """What the transport holds beside the queues (absent with kombu's stock one)."""
        held = [state for state in states if state.delayed is not None]
        if not held:
            return
        delayed = self._gauge("queue_delayed")
        due = self._gauge("queue_delayed_next_due_age_seconds")
        in_flight, inboxes = self._gauge("queue_in_flight"), self._gauge("queue_in_inboxes")
        alive = self._gauge("queue_consumers_alive")
        skew = self._gauge("clock_skew_seconds")
        for state in held:
            delayed.add_metric([state.queue], state.delayed or 0)
            if state.next_due_in is not None:  # absent when nothing is delayed
                due.add_metric([state.queue], -state.next_due_in)
            in_flight.add_metric([state.queue], state.in_flight or 0)
            inboxes.add_metric([state.queue], state.in_inboxes or 0)
            alive.add_metric([state.queue], state.consumers_alive or 0)
            if state.clock_skew is not None:  # absent until a keeper measured it
                skew.add_metric([state.queue], state.clock_skew)
        yield from (delayed, due, in_flight, inboxes, alive, skew)

    def _store_metrics(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        up = self._gauge("store_up")
        store = self.app.store
        try:
            counters, dead_letters = store.counters(), store.count_dead_letters()
            counters = folded(counters, self.known_tasks)
        except Exception:
            logger.exception("could not read the counters from the store")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        stored = self._gauge("dead_letters")
        stored.add_metric([], dead_letters)
        yield stored
        by_event = counts.events(counters)
        for event, (noun, doc) in EVENT_COUNTERS.items():
            family = CounterMetricFamily(f"{NAMESPACE}_{noun}", doc, labels=["queue", "task"])
            for (name, task), value in sorted(by_event.items()):
                if name == event:
                    family.add_metric([self.task_queues.get(task, ""), task], value)
            yield family
        tasks = sorted({task for (_, task) in counters})
        for hist, (noun, doc) in HISTOGRAMS.items():
            histogram = HistogramMetricFamily(f"{NAMESPACE}_{noun}", doc, labels=["queue", "task"])
            for task in tasks:
                observed = counts.histogram(counters, hist, task)
                if observed.count:
                    buckets = [(_le(bound), n) for bound, n in observed.buckets]
                    labels = [self.task_queues.get(task, ""), task]
                    histogram.add_metric(labels, buckets, observed.total)
            yield histogram

    def _outbox_metrics(self) -> Iterator[Metric]:
        if self.outbox_lag is None:
            return
        try:
            lag = self.outbox_lag()
        except Exception:
            logger.exception("could not read the outbox lag")
            return
        if lag is not None:
            gauge = self._gauge("outbox_lag_seconds")
            gauge.add_metric([], float(lag))
            yield gauge


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def serve(
    app: Any,
    port: int = DEFAULT_PORT,
    addr: str = DEFAULT_ADDR,
    *,
    consumers_every: float = 15.0,
    outbox_lag: OutboxLag | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve ``/metrics`` until SIGTERM or SIGINT (or ``stop`` is set)."""
    exporter = Exporter(app, outbox_lag=outbox_lag)  # MissingExtra without 'metrics'
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    stop = stop or threading.Event()
    exporter.refresh_consumers()  # the first scrape already knows the consumers
    registry = CollectorRegistry(auto_describe=False)
    registry.register(cast("Collector", exporter))  # a collector by its collect()
    server, _ = start_http_server(port, addr, registry)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    exporter.watch_consumers(consumers_every, stop)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
