"""Priority levels per job and per workload (``conventions.jobs.priority``): a level, never
a number, turned into the message priority of the app's broker when the job is routed."""

from __future__ import annotations

from typing import Any

import pytest

from conventions import App, Payload
from conventions.errors import ConfigurationError
from conventions.jobs.contract import Contract


class Order(Payload):
    order_id: str


def _app(broker_url: str = "redis://127.0.0.1:6379/0", **conf: object) -> App:
    app = App("job_priorities", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        conventions_workloads={"email": "email", "light": "email", "heavy": "heavy"},
        **conf,
    )
    return app


def _job(app: App, name: str, workload: str, **options: Any) -> Any:
    @app.job(name, payload=Order, key="o:{order_id}", workload=workload, **options)
    def body(payload: Order, ctx: Any) -> None: ...

    return body


def _route(app: App, task: Any, **options: Any) -> dict[str, Any]:
    route: dict[str, Any] = app.amqp.router.route(options, task.name, (), {}, task_type=task)
    return route


def test_a_jobs_level_becomes_its_redis_priority_step() -> None:
    app = _app()
    urgent = _job(app, "shop.urgent.v1", "email", priority="high")
    later = _job(app, "shop.later.v1", "email", priority="low")

    assert _route(app, urgent)["priority"] == 0
    assert _route(app, later)["priority"] == 6
    assert _route(app, later)["queue"].name == "email"


def test_a_workloads_level_applies_to_its_jobs_and_a_jobs_own_level_wins() -> None:
    app = _app(conventions_workload_priorities={"light": "high", "heavy": "low"})
    light = _job(app, "shop.light.v1", "light")
    heavy = _job(app, "shop.heavy.v1", "heavy")
    heavy_but_urgent = _job(app, "shop.heavy_urgent.v1", "heavy", priority="normal")
    plain = _job(app, "shop.plain.v1", "email")

    assert _route(app, light)["priority"] == 0
    assert _route(app, heavy)["priority"] == 6
    assert _route(app, heavy_but_urgent)["priority"] == 3
    assert "priority" not in _route(app, plain)


def test_on_rabbitmq_the_levels_count_the_other_way() -> None:
    app = _app("amqp://guest:guest@127.0.0.1:5672//")
    levels = {level: _job(app, f"shop.{level}.v1", "email", priority=level)
              for level in ("high", "normal", "low")}  # fmt: skip

    assert {level: _route(app, task)["priority"] for level, task in levels.items()} == {
        "high": 9,
        "normal": 4,
        "low": 0,
    }


def test_a_calls_own_priority_wins_over_the_route() -> None:
    app = _app()
    later = _job(app, "shop.later.v1", "email", priority="low")

    assert _route(app, later, priority=0)["priority"] == 0


@pytest.mark.parametrize("level", ["urgent", 0, "HIGH"])
def test_a_job_with_a_number_or_an_unknown_level_fails_at_definition(level: object) -> None:
    with pytest.raises(ConfigurationError, match="high, normal, low"):
        _job(_app(), "shop.bad.v1", "email", priority=level)


def test_an_unknown_workload_level_fails_at_the_first_jobs_definition() -> None:
    app = _app(conventions_workload_priorities={"light": 9})

    with pytest.raises(ConfigurationError, match=r"conventions_workload_priorities\['light'\]"):
        _job(app, "shop.any.v1", "email")


def test_a_job_from_a_contract_takes_its_level_from_its_workload_only() -> None:
    contract = Contract("shop.contract.v1", payload=Order, key="o:{order_id}", workload="email")

    with pytest.raises(ConfigurationError, match="conventions_workload_priorities"):
        _app().job(contract, priority="high")
