"""``watchdog.register(app)`` in an app of its own workloads: a new user's first call."""

from __future__ import annotations

import pytest

from conventions import App
from conventions.errors import ConfigurationError
from conventions.schedules import watchdog


def _app(workloads: dict[str, str], **conf: object) -> App:
    app = App("watchdog_workload", set_as_current=False)
    app.conf.update(conventions_workloads=workloads, **conf)
    return app


def test_the_watchdog_runs_on_the_workload_of_the_default_queue_when_there_is_no_light() -> None:
    app = _app({"billing": "celery", "reports": "reports"}, task_default_queue="celery")

    task = watchdog.register(app)

    assert task.name == watchdog.TASK
    assert task.workload == "billing"


def test_the_watchdog_takes_an_apps_only_workload() -> None:
    assert watchdog.register(_app({"jobs": "jobs"})).workload == "jobs"


def test_the_watchdog_keeps_light_when_the_app_has_it() -> None:
    assert watchdog.register(_app({"light": "fast", "heavy": "slow"})).workload == "light"


def test_an_app_with_no_fitting_workload_is_told_to_pass_workload() -> None:
    app = _app({"billing": "billing", "reports": "reports"}, task_default_queue="celery")

    with pytest.raises(ConfigurationError, match=r"register\(app, workload=\.\.\.\)") as refused:
        watchdog.register(app)

    assert "['billing', 'reports']" in str(refused.value)


def test_the_workload_given_wins() -> None:
    app = _app({"billing": "celery", "ops": "ops"}, task_default_queue="celery")

    assert watchdog.register(app, workload="ops").workload == "ops"
