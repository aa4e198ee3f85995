"""The how-to examples run for real: a worker of the examples' app on Redis, the
idempotency example against PostgreSQL, the Flask example through Flask's test client."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from examples.howto import adopt, idempotency
from examples.howto.app import app
from tests.integration.helpers import wait_for


@pytest.fixture(scope="module")
def examples_worker(services: None) -> Iterator[Any]:
    """A thread worker of the examples' app on the email queue."""
    from celery.contrib.testing.worker import start_worker

    from conventions.testing.worker import own_event_loop

    with (
        own_event_loop(),
        start_worker(
            app,
            pool="threads",
            concurrency=2,
            queues=["email"],
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=20,
        ) as worker,
    ):
        yield worker


def entries_of(event_id: str) -> int:
    with idempotency.database().connect() as conn:
        count = conn.execute(
            sa.select(sa.func.count()).where(idempotency.entries.c.event_id == event_id)
        ).scalar_one()
    return int(count)


def test_a_resent_webhook_is_deduplicated_and_applied_once(examples_worker: Any) -> None:
    first = idempotency.apply_webhook.delay(event_id="evt_howto_1", order_id="ord_1")
    again = idempotency.apply_webhook.delay(event_id="evt_howto_1", order_id="ord_1")
    assert again.deduplicated and again.id == first.id
    assert first.get(timeout=30) == "applied"
    assert entries_of("evt_howto_1") == 1


def test_once_stops_a_second_effect_even_when_the_body_runs_again(examples_worker: Any) -> None:
    from conventions import JobContext
    from conventions.tracing.context import Trace

    payload = idempotency.PaymentEvent(event_id="evt_howto_2", order_id="ord_2")
    ctx = JobContext(idempotency.apply_webhook.name, "t-2", "payment-event:evt_howto_2", 1,
                     Trace("corr-2"))  # fmt: skip
    assert idempotency.apply_webhook.run(payload, ctx) == "applied"
    assert idempotency.apply_webhook.run(payload, ctx) == "already applied"
    assert entries_of("evt_howto_2") == 1


def test_the_old_plain_task_forwards_to_the_convention_task(services: None) -> None:
    """The adopt page's app (the reliable profile, its own queue ``celery``): a worker of it
    runs the old plain task, which forwards to the convention job."""
    from celery.contrib.testing.worker import start_worker

    from conventions.testing.worker import own_event_loop

    adopt.app.conf.conventions_doctor_levels = {"redis-no-persistence": "warning"}
    with own_event_loop(), start_worker(
        adopt.app, pool="threads", concurrency=2, queues=["celery"],
        perform_ping_check=False, loglevel="WARNING", shutdown_timeout=20,
    ):  # fmt: skip
        forwarded = adopt.send_welcome_email.delay(42).get(timeout=30)
        result = adopt.app.AsyncResult(forwarded)
        assert wait_for(result.ready, 30)
        assert result.get(timeout=5) == "welcomed usr_42"


def test_the_flask_example_answers_202_with_a_run_id_and_echoes_the_correlation_id(
    services: None,
) -> None:
    from examples.flask_runs import app as flask_app

    client = flask_app.test_client()
    started = client.post(
        f"/reports/daily-sales/{dt.date(2026, 1, 4)}", headers={"X-Correlation-ID": "corr-flask"}
    )
    assert started.status_code == 202
    assert started.headers["X-Correlation-ID"] == "corr-flask"
    run_id, poll = started.get_json()["run_id"], started.get_json()["poll"]
    polled = client.get(poll).get_json()
    assert (polled["run_id"], polled["state"]) == (run_id, "queued")  # nobody reads heavy yet
    from celery.contrib.testing.worker import start_worker

    from conventions.testing.worker import own_event_loop
    from tasks import app as tasks_app

    with own_event_loop(), start_worker(
        tasks_app, pool="threads", concurrency=1, queues=["heavy"],
        perform_ping_check=False, loglevel="WARNING", shutdown_timeout=20,
    ):  # fmt: skip
        done = wait_for(
            lambda: (r := client.get(poll).get_json())["state"] in ("succeeded", "failed") and r,
            60,
        )
    assert (done["state"], done["error"]) == ("succeeded", None)
    run = tasks_app.store.get_run(run_id)
    assert run is not None and (run.state, run.correlation_id) == ("succeeded", "corr-flask")
