"""The doctor on RabbitMQ's consumer_timeout (no broker)."""

from __future__ import annotations

import itertools
from typing import Any

from conventions import App, Backoff, JobContext, Payload
from conventions.config.profile import INBOX_TRANSPORT, reliable
from conventions.jobs.routing import WorkloadRouter, queues_for
from conventions.ops.doctor import ERROR, WARNING, Finding, static_checks

AMQP = "amqp://guest:guest@127.0.0.1:5672//"
STORE = "redis://127.0.0.1:6379/0"
_NUMBERS = itertools.count(1)


class Ids(Payload):
    order_id: str


def _app(**conf: Any) -> App:
    workloads = {"email": "email"}
    app = App(f"q25_doctor_{next(_NUMBERS)}", set_as_current=False)
    app.conf.update(
        reliable(broker_url=AMQP, store_url=STORE),
        task_queues=queues_for(workloads),
        task_routes=(WorkloadRouter(workloads),),
        task_default_queue="email",
        conventions_workloads=workloads,
    )
    app.conf.update(conf)
    return app


def _job(app: App, **options: Any) -> str:
    name = f"q25.remind_{next(_NUMBERS)}.v1"

    def body(payload: Ids, ctx: JobContext) -> None: ...

    app.job(name, payload=Ids, key="q25:{order_id}", workload="email", **options)(body)
    return name


def _found(findings: list[Finding], subject: str) -> set[tuple[str, str]]:
    return {(f.level, f.code) for f in findings if f.subject == subject}


def test_a_time_limit_plus_a_held_retry_countdown_reaching_consumer_timeout_warns() -> None:
    app = _app()
    name = _job(app, time_limit=1000, backoff=Backoff(cap=850))  # 1850 s >= 1800 s
    findings = [f for f in static_checks(app, server=False) if f.subject == name]
    assert _found(findings, name) == {(WARNING, "rabbitmq-consumer-timeout")}
    (warning,) = findings
    assert "consumer_timeout = " in warning.message and "x-consumer-timeout" in warning.message


def test_below_consumer_timeout_nothing_is_found_and_the_setting_moves_the_bound() -> None:
    app = _app()
    name = _job(app, time_limit=1000, backoff=Backoff(cap=700))  # 1700 s < 1800 s
    assert _found(static_checks(app, server=False), name) == set()
    app.conf.update(conventions_broker_consumer_timeout=1600)
    assert _found(static_checks(app, server=False), name) == {
        (WARNING, "rabbitmq-consumer-timeout")
    }


def test_a_time_limit_beyond_consumer_timeout_alone_stays_one_error() -> None:
    app = _app()
    name = _job(app, time_limit=3600, backoff=Backoff(cap=850))
    assert _found(static_checks(app, server=False), name) == {
        (ERROR, "time-limit-beyond-consumer-timeout")
    }


def test_on_redis_the_consumer_timeout_is_not_checked() -> None:
    app = _app(broker_url="redis://127.0.0.1:6379/0", broker_transport=INBOX_TRANSPORT)
    name = _job(app, time_limit=1000, backoff=Backoff(cap=850))
    assert _found(static_checks(app, server=False), name) == set()
