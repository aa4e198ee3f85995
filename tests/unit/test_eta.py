"""``eta=`` at the call site: what Celery accepts is accepted, anything else refused.

Celery accepts an aware ``datetime``, a naive one and an ISO 8601 string; its worker reads a
naive moment as UTC (``maybe_make_aware(..., naive_as_utc=True)``). The layer does the same
before it checks the delay against the broker's safe maximum, and refuses what Celery would
turn into a lost job (an unparseable string, which the worker rejects as InvalidTaskError).

No broker: the app publishes through kombu's in-memory transport, the store is SQLite.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kombu import Exchange, Queue

from conventions import App, Id, JobContext, Payload
from conventions.errors import ConfigurationError
from conventions.jobs.routing import WorkloadRouter
from conventions.task import ConventionTask

_NUMBERS = itertools.count(1)


class Remind(Payload):
    order_id: Id


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    app = App("eta_test", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        task_queues=(Queue("email", Exchange("email"), routing_key="email"),),
        task_routes=(WorkloadRouter({"email": "email"}),),
        task_default_queue="email",
        conventions_workloads={"email": "email"},
        conventions_max_countdown=3600,
        conventions_store_url=f"sqlite:///{tmp_path / 'store.db'}",
    )
    _waiting(app)  # kombu's in-memory queues are shared by the whole process
    yield app
    app.store.close()
    app.close()


def _job(app: App) -> ConventionTask:
    """A job of its own name (Celery shares task names across apps)."""

    def body(payload: Remind, ctx: JobContext) -> None: ...

    return app.job(
        f"shop.eta_remind_{next(_NUMBERS)}.v1", payload=Remind, key="remind:{order_id}",
        workload="email",
    )(body)  # fmt: skip


def _waiting(app: App) -> list[Any]:
    """The messages waiting in the in-memory ``email`` queue (taken off it)."""
    messages = []
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue("email")
        while queue.qsize():
            messages.append(queue.get(timeout=1))
        queue.close()
    return messages


def test_a_naive_eta_is_read_as_utc_and_published(app: App) -> None:
    job = _job(app)
    naive = datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=5)
    handle = job.apply_async(kwargs={"order_id": "ord_1"}, eta=naive)
    assert handle.deduplicated is False
    [message] = _waiting(app)
    sent = datetime.fromisoformat(message.headers["eta"])
    assert sent == naive.replace(tzinfo=UTC)


def test_a_string_eta_is_parsed_and_published(app: App) -> None:
    job = _job(app)
    moment = (datetime.now(UTC) + timedelta(minutes=5)).replace(microsecond=0)
    job.apply_async(kwargs={"order_id": "ord_2"}, eta=moment.isoformat())
    [message] = _waiting(app)
    assert datetime.fromisoformat(message.headers["eta"]) == moment


@pytest.mark.parametrize("kind", ["aware", "naive", "string"])
def test_an_eta_beyond_the_safe_maximum_is_refused_in_every_form(app: App, kind: str) -> None:
    job = _job(app)
    far = datetime.now(UTC) + timedelta(days=2)
    eta: Any = {"aware": far, "naive": far.replace(tzinfo=None), "string": far.isoformat()}[kind]
    with pytest.raises(ConfigurationError, match="beyond the broker's safe maximum"):
        job.apply_async(kwargs={"order_id": "ord_3"}, eta=eta)
    assert _waiting(app) == []


@pytest.mark.parametrize("eta", ["next tuesday", 1700000000, "2026-13-40T00:00:00"])
def test_an_eta_celery_cannot_read_is_refused_at_the_call_site(app: App, eta: Any) -> None:
    job = _job(app)
    with pytest.raises(ConfigurationError, match="eta"):
        job.apply_async(kwargs={"order_id": "ord_4"}, eta=eta)
    assert _waiting(app) == []
    # nothing reserved either: the same key publishes at once
    assert job.apply_async(kwargs={"order_id": "ord_4"}).deduplicated is False
