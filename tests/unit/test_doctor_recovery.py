"""The doctor on time with the layer's Redis transport: the recovery bound, and what the
live checks make of the delayed set and the liveness set (no broker, no Redis server)."""

from __future__ import annotations

from typing import Any

import pytest

from conventions import App, JobContext, Payload
from conventions.config.profile import reliable
from conventions.jobs.routing import WorkloadRouter, queues_for
from conventions.observability.queues import Held
from conventions.ops.doctor import ERROR, WARNING, layer_transport, static_checks
from conventions.ops.doctor_live import OVERDUE, Live, live_checks
from conventions.transport.redis import Transport

RECOVERY = "broker_transport_options['recovery_timeout']"


class Ids(Payload):
    order_id: str


def _app(name: str = "recovery_test", **options: Any) -> App:
    app = App(name, set_as_current=False)
    app.conf.update(
        reliable(broker_url="redis://localhost:6379/0", store_url="redis://localhost:6379/0",
                 broker_transport_options=options, allow={"visibility_timeout"}),
        task_queues=queues_for({"email": "email", "heavy": "heavy"}),
        task_routes=(WorkloadRouter({"email": "email", "heavy": "heavy"}),),
        task_default_queue="email",
        conventions_workloads={"email": "email", "heavy": "heavy"},
    )  # fmt: skip
    return app


def _recovery(**options: Any) -> list[tuple[str, str]]:
    findings = static_checks(_app(**options), server=False)
    return [(f.level, f.code) for f in findings if f.subject == RECOVERY]


def test_the_default_recovery_timeout_and_any_up_to_36_seconds_are_sound() -> None:
    assert _recovery() == []
    assert _recovery(recovery_timeout=36) == []  # a bound of 60 s
    assert _recovery(recovery_timeout=10, polling_interval=1) == []


def test_a_recovery_bound_above_60_seconds_is_an_error_naming_the_limit() -> None:
    assert _recovery(recovery_timeout=40) == [(ERROR, "recovery-timeout-too-long")]
    (finding,) = [f for f in static_checks(_app(recovery_timeout=40), server=False)
                  if f.subject == RECOVERY]  # fmt: skip
    assert "up to 67s (above 60)" in finding.message and "36 or less" in finding.message


@pytest.mark.parametrize(
    "options",
    [
        {"recovery_timeout": 3, "polling_interval": 2},  # renewal every 1 s, a 2 s block
        {"recovery_timeout": 1.5, "fetch_wait": 1},
    ],
)
def test_a_recovery_bound_a_blocked_fetch_could_outlast_is_an_error(
    options: dict[str, Any],
) -> None:
    assert _recovery(**options) == [(ERROR, "recovery-timeout-too-short")]


def test_a_recovery_bound_of_a_few_seconds_is_a_warning_for_tests_only() -> None:
    assert _recovery(recovery_timeout=3, polling_interval=0.5) == [
        (WARNING, "recovery-timeout-too-short")
    ]


def test_the_recovery_bound_is_not_checked_on_kombus_stock_transport() -> None:
    app = _app(recovery_timeout=600)
    app.conf.broker_transport = None
    assert not layer_transport(app.conf)
    assert [f for f in static_checks(app, server=False) if f.subject == RECOVERY] == []


def test_the_layers_transport_is_recognized_by_name_or_by_class() -> None:
    app = _app()
    assert layer_transport(app.conf)
    for chosen in ("conventions.transport.redis.Transport", Transport):
        app.conf.broker_transport = chosen
        assert layer_transport(app.conf)
    app.conf.broker_transport = "redis"
    assert not layer_transport(app.conf)
    app.conf.broker_url = "amqp://localhost//"
    app.conf.broker_transport = Transport
    assert not layer_transport(app.conf)


def _live(app: App, held: dict[str, Held], overdue: dict[str, float] | None = None) -> Live:
    return Live(consumers={"w1@host": ["email"]}, backlog={"email": 0, "heavy": 0},
                held=held, overdue=overdue or {})  # fmt: skip


def _job(app: App, workload: str) -> None:
    def body(payload: Ids, ctx: JobContext) -> None: ...

    app.job(f"shop.{workload}_recovery.v1", payload=Ids, key="r:{order_id}",
            workload=workload)(body)  # fmt: skip


def _found(app: App, live: Live) -> dict[tuple[str, str], tuple[str, str]]:
    return {(f.code, f.subject): (f.level, f.message) for f in live_checks(app, live)}


def test_delayed_jobs_of_a_queue_nobody_consumes_are_an_error() -> None:
    app = _app("recovery_live_1")
    live = _live(app, {"email": Held(consumers_alive=1), "heavy": Held(delayed=4)})
    level, message = _found(app, live)["backlog-without-consumer", "heavy"]
    assert level == ERROR and "0 messages wait, 4 delayed" in message
    _job(app, "heavy")
    level, message = _found(app, live)["queue-without-consumer", "heavy"]
    assert level == ERROR and "(0 waiting, 4 delayed)" in message


def test_a_due_job_left_in_the_delayed_set_of_a_consumed_queue_is_a_warning() -> None:
    app = _app("recovery_live_2")
    held = {"email": Held(delayed=1, consumers_alive=1)}
    assert ("delayed-not-moved", "email") not in _found(app, _live(app, held, {"email": 5.0}))
    found = _found(app, _live(app, held, {"email": OVERDUE + 30}))
    assert found["delayed-not-moved", "email"][0] == WARNING


def test_a_consumed_queue_without_a_consumer_alive_is_a_warning() -> None:
    app = _app("recovery_live_3")
    found = _found(app, _live(app, {"email": Held(consumers_alive=0)}))
    level, message = found["consumer-not-alive", "email"]
    assert level == WARNING and "visibility timeout" in message
    assert ("consumer-not-alive", "email") not in _found(
        app, _live(app, {"email": Held(consumers_alive=2)})
    )
    # kombu's stock transport: nothing is held, nothing is said
    assert ("consumer-not-alive", "email") not in _found(app, _live(app, {}))


def test_with_renewal_turned_off_a_time_limit_beyond_the_visibility_timeout_is_an_error() -> None:
    from conventions import Backoff

    app = _app("recovery_renewal_off", visibility_timeout=10, renew_unacked=False)

    def body(payload: Ids, ctx: JobContext) -> None: ...

    name = "shop.long_recovery.v1"
    app.job(name, payload=Ids, key="l:{order_id}", workload="heavy", time_limit=60,
            backoff=Backoff(cap=86400))(body)  # fmt: skip
    codes = {(f.code, f.level) for f in static_checks(app, server=False) if f.subject == name}
    assert codes == {("time-limit-beyond-visibility", ERROR)}  # delays still wait in Redis
