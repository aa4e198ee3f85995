"""The ``rabbitmq`` section: the layer's publish and drain against raw Celery on RabbitMQ.

Three apps on the same RabbitMQ (``BENCH_AMQP_URL``, default the machine's ``/`` vhost),
results (and the layer's store) on the benchmark's Redis, each with a queue of its own:

* ``conv``: a convention app built from ``reliable(broker_url="amqp://...")`` as it
  comes (its workload queue is what the profile makes of RabbitMQ);
* ``raw_quorum``: raw Celery with the same reliable settings on a quorum queue, with
  publisher confirms: what the profile asks of RabbitMQ, without the layer;
* ``raw``: raw Celery with the same reliable settings on Celery's default (classic)
  queue, without confirms.

Publish: each variant publishes from a process of its own (``python -m bench.rabbitmq
publisher VARIANT``; the raw ones never import ``conventions``, whose publish hook is
process-wide), ``n`` jobs per round, the rounds interleaved and the queues purged in
between. Drain: each variant's worker (``-P prefork -c 2``, kept up) has its consumer
cancelled while its own producer publishes a slice, then added back: the slice's rate is
the jobs taken after the first ``skip`` over the time until its queue is empty and its
last job's result is stored. Ratios are per round, reported as medians.

Targets: the drain answers to the Redis drain's (``>= 0.9`` against raw Celery on the same
broker guarantees: the worker's store work is the same on both brokers); the publish to
``>= 0.5``, since a publish goes to two servers (the store's reservation in Redis, then
the confirmed publish to RabbitMQ) where raw Celery goes to one, and the one-trip script
of the Redis transport cannot fold them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bench import common, publisher
from bench.report import Report, Row

#: the variants, in their interleaving order
VARIANTS = ("conv", "raw_quorum", "raw")
LABELS = {
    "conv": "conventions, reliable(amqp)",
    "raw_quorum": "raw Celery, reliable settings, quorum queue + confirms",
    "raw": "raw Celery, reliable settings, classic queue",
}
#: jobs each worker takes before the measuring starts (imports, connections, forks)
WARM = 50
#: seconds between two looks at a draining queue
POLL = 0.005
#: the layer's poison queue of the ``conv`` app (never the demo's)
POISON_QUEUE = "bench_rmq_poison"


def amqp_url() -> str:
    return os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def queue(variant: str) -> str:
    return f"bench_rmq_{variant}"


def _conv() -> Any:
    from conventions import App, Id, JobContext, Payload
    from conventions.config.profile import reliable

    class Noop(Payload):
        order_id: Id

    app = App("bench_rmq_conv", set_as_current=False)
    app.conf.update(reliable(broker_url=amqp_url(), store_url=common.url(),
                             result_backend=common.url()))  # fmt: skip
    levels = os.environ.get("CONVENTIONS_DOCTOR_LEVELS", "")
    app.conf.update(
        conventions_workloads={"bench": queue("conv")},
        conventions_workload_time_limits={"bench": 60.0},
        conventions_retention_enabled=False,
        conventions_poison_queue=POISON_QUEUE,
        conventions_doctor_levels=dict(item.split("=", 1) for item in levels.split(",") if item),
        task_default_queue="bench_rmq_default",
    )

    @app.job("bench.rmq_noop_conv.v1", payload=Noop, key="noop:{order_id}", workload="bench")
    def noop(payload: Noop, ctx: JobContext) -> None:
        """Nothing: the machinery around the body is what is measured."""

    return app


def _raw(variant: str) -> Any:
    from celery import Celery
    from kombu import Exchange, Queue

    from bench.apps_raw import RELIABLE

    name = queue(variant)
    quorum = variant == "raw_quorum"
    arguments = {"x-queue-type": "quorum"} if quorum else None
    app = Celery(f"bench_rmq_{variant}", broker=amqp_url(), backend=common.url(),
                 set_as_current=False)  # fmt: skip
    declared = Queue(name, Exchange(name, type="direct"), routing_key=name,
                     queue_arguments=arguments)  # fmt: skip
    app.conf.update(
        task_queues=(declared,),
        task_default_queue=name,
        task_default_exchange=name,
        task_default_routing_key=name,
        task_create_missing_queues=False,
        broker_transport_options={"confirm_publish": True} if quorum else {},
        **RELIABLE,
    )

    @app.task(name=f"bench.rmq_noop_{variant}", shared=False)  # type: ignore[untyped-decorator]
    def noop(order_id: str) -> None:
        """Nothing, like the convention task's body."""

    return app


def make(variant: str) -> Any:
    return _conv() if variant == "conv" else _raw(variant)


_APPS: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``-A bench.rabbitmq:conv`` (or ``raw``, ``raw_quorum``): each app is built when
    first asked for, so that a raw worker never imports ``conventions``."""
    if name in VARIANTS:
        if name not in _APPS:
            _APPS[name] = make(name)
        return _APPS[name]
    raise AttributeError(name)


def task_of(variant: str) -> Any:
    app = __getattr__(variant)
    return app.tasks["bench.rmq_noop_conv.v1" if variant == "conv" else f"bench.rmq_noop_{variant}"]


# -- the producer process -------------------------------------------------------------------
def _serve(variant: str) -> None:
    """Answer the harness on stdin: ``N`` publishes N (the seconds back), ``fill N``
    publishes N (the last task id back), ``quit`` ends."""
    task = task_of(variant)

    def publish(order_id: str) -> Any:
        return task.delay(order_id=order_id)

    print("ready", flush=True)
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        if command[0] == "fill":
            last = None
            for n in range(int(command[1])):
                last = publish(f"ord_{os.getpid()}_{time.monotonic_ns()}_{n}")
            print(getattr(last, "id", ""), flush=True)
        else:
            print(f"{publisher.timed(publish, int(command[0])):.6f}", flush=True)


class Producer(publisher.Producer):
    """:class:`bench.publisher.Producer` on this module's producer process, which can also
    ``fill`` a queue (and answers the last job's id)."""

    def __init__(self, variant: str) -> None:  # the process differs: no super().__init__
        self.variant = variant
        self.proc = subprocess.Popen(
            [common.python(), "-m", "bench.rabbitmq", "publisher", variant],
            cwd=common.ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def fill(self, n: int) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"fill {n}\n")
        self.proc.stdin.flush()
        return self._read()


def _env() -> dict[str, str]:
    return {**common.env(), "BENCH_AMQP_URL": amqp_url()}


# -- the broker, from the harness -------------------------------------------------------------
class Broker:
    """The harness's connection to RabbitMQ: queue depths, purges, deletes."""

    def __init__(self) -> None:
        from kombu import Connection

        self.connection = Connection(amqp_url(), connect_timeout=5)
        self.channel = self.connection.channel()

    def ready(self, name: str) -> int:
        """Messages ready in queue ``name`` (0 when it does not exist yet)."""
        try:
            return int(self.channel.queue_declare(name, passive=True).message_count)
        except Exception:  # a passive declare of a missing queue closes the channel
            self.channel = self.connection.channel()
            return 0

    def purge(self, name: str) -> None:
        try:
            self.channel.queue_purge(name)
        except Exception:
            self.channel = self.connection.channel()

    def delete(self, *names: str) -> None:
        for name in names:
            self.channel.queue_delete(name)
            self.channel.exchange_delete(name)

    def close(self) -> None:
        self.connection.close()


def _reset(broker: Broker) -> None:
    broker.delete(*(queue(v) for v in VARIANTS), POISON_QUEUE, "bench_rmq_default")


# -- publish ----------------------------------------------------------------------------------
def publish_rates(broker: Broker, n: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per publish of every variant, round by round."""
    producers = {variant: Producer(variant) for variant in VARIANTS}
    try:
        for producer in producers.values():
            producer.wait_ready()
            producer.publish(50)  # warm: connections, the topology's declaration

        def clean() -> None:
            for variant in VARIANTS:
                broker.purge(queue(variant))

        clean()
        measure = {v: partial(lambda p, k: p.publish(k) / k, p, n) for v, p in producers.items()}
        return common.interleave(measure, rounds, on_round=clean)
    finally:
        for producer in producers.values():
            producer.close()


# -- drain ------------------------------------------------------------------------------------
class Drain:
    """One variant's worker and producer, and the control app that pauses its consumer."""

    def __init__(self, variant: str, control: Any) -> None:
        self.variant, self.control = variant, control
        self.name = f"bench-rmq-{variant}"
        self.node = f"{self.name}@{socket.gethostname()}"
        self.producer = Producer(variant)
        self.worker: Any = None

    def _worker(self) -> Any:
        from bench import procs

        ready = procs.run_dir() / f"{self.name}.ready"
        argv = [
            common.python(), "-m", "bench.launch", "--no-hiredis", "--ready", str(ready), "--",
            "-A", f"bench.rabbitmq:{self.variant}", "worker", "-P", "prefork", "-c", "2",
            "-Q", queue(self.variant), "-n", f"{self.name}@%h", "--without-gossip",
            "--without-mingle", "--without-heartbeat", "--loglevel=WARNING",
        ]  # fmt: skip
        return procs.Worker(self.name, argv, ready, env=_env())

    def start(self, broker: Broker, client: Any) -> None:
        """Publish the warm-up jobs first (the first publish of ``conv`` declares its
        topology, which the worker's delayed-delivery step binds to), then start the
        worker, let it drain them, and pause its consumer."""
        self.producer.wait_ready()
        last = self.producer.fill(WARM)
        self.worker = self._worker()
        self.worker.wait_ready()
        deadline = time.monotonic() + 120
        while broker.ready(queue(self.variant)) or not client.exists(f"celery-task-meta-{last}"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.variant}: the warm-up jobs did not drain")
            time.sleep(POLL)
        self.pause()

    def pause(self) -> None:
        self.control.cancel_consumer(queue(self.variant), destination=[self.node], reply=True,
                                     timeout=10)  # fmt: skip

    def resume(self) -> None:
        self.control.add_consumer(queue(self.variant), destination=[self.node], reply=True,
                                  timeout=10)  # fmt: skip

    def stop(self) -> None:
        self.producer.close()
        if self.worker is not None:
            self.worker.stop()


def drain_slice(broker: Broker, client: Any, item: Drain, n: int, skip: int) -> float:
    """Publish ``n`` jobs with the consumer paused, resume it; jobs per second after the
    first ``skip``, until the queue is empty and the last job's result is stored."""
    last = item.producer.fill(n)
    name = queue(item.variant)
    deadline = time.perf_counter() + n / 5 + 120
    item.resume()
    started, remaining, counting = time.perf_counter(), n, False
    while True:
        waiting = broker.ready(name)
        now = time.perf_counter()
        if not counting and waiting <= n - skip:
            counting, started, remaining = True, now, waiting
        if waiting == 0 and client.exists(f"celery-task-meta-{last}"):
            break
        if now > deadline:
            raise TimeoutError(f"{item.variant}: {waiting} jobs still waiting")
        time.sleep(POLL)
    elapsed = time.perf_counter() - started
    item.pause()
    return remaining / elapsed if elapsed > 0 else float("nan")


def drain_rates(broker: Broker, client: Any, n: int, rounds: int) -> dict[str, list[float]]:
    from celery import Celery

    control_app = Celery("bench_rmq_control", broker=amqp_url(), set_as_current=False)
    items = [Drain(variant, control_app.control) for variant in VARIANTS]
    try:
        for item in items:
            item.start(broker, client)
        size = n // rounds
        skip = max(5, size // 50)
        measure: dict[str, Callable[[], float]] = {
            item.variant: partial(drain_slice, broker, client, item, size, skip) for item in items
        }
        rates = common.interleave(measure, rounds)
        problems = [f"{i.variant}: {line}" for i in items for line in i.worker.errors()[:3]]
        if problems:
            raise RuntimeError("worker errors during the drain:\n" + "\n".join(problems))
        return rates
    finally:
        for item in items:
            item.stop()
        control_app.close()


# -- the section ------------------------------------------------------------------------------
def _ratio(values: dict[str, list[float]], a: str, b: str, *, times: bool) -> float:
    """``a``'s rate over ``b``'s, round by round (times: the inverse)."""
    pairs = common.ratios(values[b], values[a]) if times else common.ratios(values[a], values[b])
    return common.median(pairs)


def rows(published: dict[str, list[float]], drained: dict[str, list[float]]) -> list[Row]:
    def us(name: str) -> str:
        return f"{name} {common.median(published[name]) * 1e6:,.0f} us"

    def rate(name: str) -> str:
        return f"{name} {common.median(drained[name]):,.0f} jobs/s"

    return [
        Row("rabbitmq", "publish: conventions vs raw Celery, quorum + confirms (rate ratio)",
            _ratio(published, "conv", "raw_quorum", times=True), "x", ">= 0.5",
            f"{us('conv')}, {us('raw_quorum')}"),
        Row("rabbitmq", "publish: conventions vs raw Celery, classic queue (rate ratio)",
            _ratio(published, "conv", "raw", times=True), "x", "", us("raw")),
        Row("rabbitmq", "drain: conventions vs raw Celery, quorum + confirms (rate ratio)",
            _ratio(drained, "conv", "raw_quorum", times=False), "x", ">= 0.9",
            f"{rate('conv')}, {rate('raw_quorum')}"),
        Row("rabbitmq", "drain: conventions vs raw Celery, classic queue (rate ratio)",
            _ratio(drained, "conv", "raw", times=False), "x", "", rate("raw")),
        Row("rabbitmq", "drain: raw Celery quorum + confirms vs classic (rate ratio)",
            _ratio(drained, "raw_quorum", "raw", times=False), "x"),
    ]  # fmt: skip


def section(report: Report, client: Any, *, publish_n: int, drain_n: int, rounds: int) -> None:
    """Publish, then drain, each interleaved across the three variants."""
    client.flushdb()
    broker = Broker()
    try:
        _reset(broker)
        published = publish_rates(broker, publish_n, rounds)
        _reset(broker)
        drained = drain_rates(broker, client, drain_n, rounds)
        for row in rows(published, drained):
            report.add(row)
        report.notes.append(
            f"rabbitmq: {amqp_url().rsplit('@', 1)[-1]}; publish {publish_n} per round, drain "
            f"{drain_n:,} jobs per variant in {rounds} interleaved slices; "
            + "; ".join(f"{v} = {LABELS[v]}" for v in VARIANTS)
        )
        _reset(broker)
    finally:
        broker.close()
        client.flushdb()


if __name__ == "__main__":
    if sys.argv[1:2] == ["publisher"]:
        _serve(sys.argv[2])
