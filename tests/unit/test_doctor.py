"""The doctor's static checks, over apps built here (no broker, no Redis server)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from conventions import App, Backoff, JobContext, Payload
from conventions.config.profile import reliable
from conventions.jobs.routing import WorkloadRouter, queues_for
from conventions.ops.doctor import ERROR, WARNING, Finding, static_checks


class Ids(Payload):
    order_id: str


#: what the doctor says of this file's test app on RabbitMQ (classic queues, no confirms)
RABBITMQ_OWN = {"classic-queue", "publish-unconfirmed"}


def _app(**conf: Any) -> App:
    """An app with the reliable profile (its queues ``email`` and ``heavy``), then
    ``conf``; ``workloads=`` routes to queues that may not be declared."""
    workloads = conf.pop("workloads", {"email": "email", "heavy": "heavy"})
    app = App("doctor_test", set_as_current=False)
    app.conf.update(
        reliable(broker_url="redis://localhost:6379/0", store_url="redis://localhost:6379/0"),
        task_queues=queues_for({"email": "email", "heavy": "heavy"}),
        task_routes=(WorkloadRouter(workloads),),
        task_default_queue="email",
        conventions_workloads=workloads,
    )
    app.conf.update(conf)
    return app


_NUMBERS = itertools.count(1)
_LAST = [""]
#: what the configuration-wide findings are about
CONFIG_SUBJECTS = ("serializers", "conventions_max_countdown", "task_create_missing_queues",
                   "broker_transport_options['recovery_timeout']")  # fmt: skip


def _job(app: App, workload: str = "email", **options: Any) -> str:
    """Declare a job (Celery shares task names across apps: each gets its own name)."""
    name = f"shop.remind_{next(_NUMBERS)}.v1"
    _LAST[0] = name

    def body(payload: Ids, ctx: JobContext) -> None: ...

    app.job(name, payload=Ids, key="remind:{order_id}", workload=workload, **options)(body)
    return name


def _codes(findings: list[Finding], level: str = ERROR) -> set[tuple[str, str]]:
    """(code, subject) of the findings at ``level``, about this test's own job or the
    configuration (Celery shares tasks between apps: other tests' jobs are left out)."""
    return {
        (f.code, f.subject)
        for f in findings
        if f.level == level and f.subject in (_LAST[0], "legacy.task", *CONFIG_SUBJECTS)
    }


def test_a_sound_app_has_no_findings() -> None:
    app = _app()
    _job(app)
    findings = static_checks(app, server=False)
    assert _codes(findings) == _codes(findings, WARNING) == set()


def test_a_workload_routed_to_an_undeclared_queue_is_an_error_that_names_the_fix() -> None:
    app = _app(workloads={"email": "email", "batch": "bacth"})
    name = _job(app, workload="batch")
    findings = static_checks(app, server=False)
    assert _codes(findings) == {("route-undeclared-queue", name)}
    (finding,) = [f for f in findings if f.subject == name]
    assert "'bacth'" in finding.message and "task_queues" in finding.message


def _stock(visibility: float = 3600, **conf: Any) -> App:
    """An app on kombu's stock Redis transport (the profile's promise broken on purpose),
    whose visibility timeout is its recovery clock and bounds its delays."""
    app = _app(broker_transport=None, **conf)
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options, "visibility_timeout": visibility,
    }  # fmt: skip
    return app


def test_a_retry_cap_beyond_the_visibility_timeout_is_refused_on_the_stock_transport() -> None:
    app = _stock()
    name = _job(app, backoff=Backoff(cap=7200))
    findings = static_checks(app, server=False)
    assert ("countdown-beyond-visibility", name) in _codes(findings)
    (message,) = [f.message for f in findings if f.subject == name]
    assert "lower the cap below 3540s" in message
    assert "visibility_timeout" in message
    assert "conventions.transport.redis:Transport" in message  # the other fix


def test_a_retry_cap_between_the_safe_countdown_and_the_visibility_timeout_is_a_warning() -> None:
    app = _stock()
    name = _job(app, backoff=Backoff(cap=3580))
    assert _codes(static_checks(app, server=False), WARNING) == {("retry-cap-clamped", name)}


def test_a_time_limit_beyond_the_visibility_timeout_is_an_error_on_the_stock_transport() -> None:
    app = _stock(visibility=600)
    name = _job(app, time_limit=1800)
    assert ("time-limit-beyond-visibility", name) in _codes(static_checks(app, server=False))


def test_on_the_layers_transport_any_delay_and_any_time_limit_are_sound() -> None:
    app = _app(broker_transport_options={"visibility_timeout": 30, "recovery_timeout": 30})
    _job(app, time_limit=1800, backoff=Backoff(cap=7 * 86400))
    findings = static_checks(app, server=False)
    assert _codes(findings) == _codes(findings, WARNING) == set()


def test_a_time_limit_beyond_rabbitmqs_consumer_timeout_is_an_error() -> None:
    app = _app(broker_url="amqp://guest@localhost//")
    name = _job(app, time_limit=3600)
    assert _codes(static_checks(app, server=False)) == {
        ("time-limit-beyond-consumer-timeout", name)
    }


def test_late_acks_without_reject_on_worker_lost_and_no_time_limit_are_found() -> None:
    app = _app(task_time_limit=None)

    @app.task(name="legacy.task", acks_late=True, reject_on_worker_lost=False, shared=False)
    def legacy() -> None: ...

    findings = static_checks(app, server=False)
    assert ("acks-late-without-reject", "legacy.task") in _codes(findings)
    assert ("no-time-limit", "legacy.task") in _codes(findings, WARNING)


@pytest.mark.parametrize(
    "conf",
    [
        {"accept_content": ["json", "pickle"]},
        {"task_serializer": "pickle"},
        {"result_accept_content": ["application/x-python-serialize"]},
    ],
)
def test_pickle_anywhere_is_an_error(conf: dict[str, Any]) -> None:
    app = _app(**conf)
    assert ("pickle-accepted", "serializers") in _codes(static_checks(app, server=False))


def test_an_explicit_max_countdown_at_or_beyond_the_visibility_timeout_is_an_error() -> None:
    app = _stock(conventions_max_countdown=3600)
    assert ("countdown-beyond-visibility", "conventions_max_countdown") in _codes(
        static_checks(app, server=False)
    )


def test_an_explicit_max_countdown_on_the_layers_transport_is_a_warning_it_is_unneeded() -> None:
    findings = static_checks(_app(conventions_max_countdown=3600), server=False)
    assert _codes(findings) == set()
    assert _codes(findings, WARNING) == {("max-countdown-unneeded", "conventions_max_countdown")}


def test_the_levels_setting_lowers_or_silences_a_check() -> None:
    app = _stock(
        visibility=120,
        accept_content=["pickle"],
        conventions_doctor_levels={
            "pickle-accepted": "warning",
            "time-limit-beyond-visibility": "off",
        },
    )
    _job(app, backoff=Backoff(cap=30))
    findings = static_checks(app, server=False)
    assert _codes(findings) == set()
    assert _codes(findings, WARNING) == {("pickle-accepted", "serializers")}


@pytest.mark.parametrize(
    ("conf", "code"),
    [
        ({"broker_transport": None}, "redis-fetch-unsafe"),
        (
            {"worker_cancel_long_running_tasks_on_connection_loss": True},
            "cancel-on-connection-loss",
        ),
    ],
)
def test_each_way_a_redis_broker_loses_a_late_ack_job_is_a_warning_with_the_fix(
    conf: dict[str, Any], code: str
) -> None:
    found = static_checks(_app(**conf), server=False)
    assert [(f.level, f.code) for f in found] == [(WARNING, code)]
    assert "set " in found[0].message
    # the same settings on RabbitMQ are fine: the broker requeues what a channel held
    # (this test app declares classic queues and no confirms: RabbitMQ's own findings)
    amqp = static_checks(_app(broker_url="amqp://localhost//", **conf), server=False)
    assert [f for f in amqp if f.code not in RABBITMQ_OWN] == []


def test_a_result_write_that_is_not_retried_is_a_warning_on_any_broker() -> None:
    for broker in ("redis://localhost:6379/0", "amqp://localhost//"):
        app = _app(broker_url=broker, result_backend_always_retry=False)
        found = [f for f in static_checks(app, server=False) if f.code not in RABBITMQ_OWN]
        assert [(f.level, f.code, f.subject) for f in found] == [
            (WARNING, "result-write-not-retried", "result_backend_always_retry")
        ]
        assert found[0].message.startswith("False, the profile's value is True")


def test_the_stores_redis_is_checked_too_when_it_is_another_server() -> None:
    from conventions.ops.doctor import redis_servers

    same = _app(conventions_store_url="redis://localhost:6379/1")
    assert redis_servers(same.conf) == ["redis://localhost:6379/0"]
    other = _app(conventions_store_url="redis://store.internal:6380/0")
    assert redis_servers(other.conf) == [
        "redis://localhost:6379/0",
        "redis://store.internal:6380/0",
    ]
    sql = _app(conventions_store_url="postgresql://db/app", broker_url="amqp://localhost//")
    assert redis_servers(sql.conf) == []


def test_a_redis_older_than_7_is_an_error_naming_what_needs_7() -> None:
    from conventions.ops.doctor import version_findings

    (found,) = version_findings("redis host:6379", "6.2.14")
    assert (found.level, found.code) == (ERROR, "redis-too-old")
    assert "BLMOVE" in found.message and "SET NX GET" in found.message
    assert list(version_findings("redis host:6379", "7.0.15")) == []
    assert list(version_findings("redis host:6379", "")) == []


GB = 10**9


def _audit(memory: int, **conf: Any) -> list[tuple[str, str]]:
    from conventions.ops.doctor import audit_findings

    app = _app(**{"conventions_store_url": "redis://localhost:6379/1", **conf})
    return [(f.level, f.code) for f in audit_findings("redis localhost:6379", app.conf, memory)]


def test_an_audit_trail_that_may_take_over_a_quarter_of_the_brokers_memory_is_a_warning() -> None:
    # the default cap: 1,000,000 trails of about 900 bytes
    assert _audit(2 * GB) == [(WARNING, "audit-fills-broker")]
    assert _audit(8 * GB) == []
    assert _audit(2 * GB, conventions_audit_max_trails=100_000) == []


def test_an_uncapped_audit_trail_on_the_brokers_server_is_a_warning_whatever_the_memory() -> None:
    assert _audit(1000 * GB, conventions_audit_max_trails=0) == [(WARNING, "audit-fills-broker")]


def test_an_audit_trail_on_a_server_of_its_own_or_in_sql_is_not_the_brokers_concern() -> None:
    assert _audit(2 * GB, conventions_store_url="redis://store.internal:6379/0") == []
    assert _audit(2 * GB, conventions_store_url="postgresql://db/app") == []
