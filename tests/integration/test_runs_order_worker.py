"""A real worker's events land before the publisher's ``published``, and the run still
ends ``succeeded``.

The two-step publish (a SQL store, ``dedup=None``: the push, then the ``published``
event) lets a fast worker start and finish the job before the publisher writes
``published``. Here the publisher's write is held for real: a PostgreSQL transaction
of the test holds the ``published`` counter row the event's transaction must update,
so the publisher blocks there until the worker's ``succeeded`` is in the run record.
Then the row is let go and the late ``published`` lands.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from conventions import App, Id, JobContext, Payload
from conventions.config.profile import reliable
from conventions.store import SQLStore
from tests.conftest import BROKER_DB, PG_BASE, REDIS_BASE
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.usefixtures("services"), pytest.mark.timeout(90)]

ADMIN_URL = PG_BASE.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
TASK = "testing.runs_order.v1"


class Item(Payload):
    item_id: Id


@pytest.fixture
def store_database() -> Iterator[str]:
    name = f"cc_order_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_BASE}/{name}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sql_app(store_database: str) -> Iterator[tuple[App, Any]]:
    queue = f"runs-order-{uuid.uuid4().hex[:8]}"
    app = App(f"runs_order_{uuid.uuid4().hex[:6]}", set_as_current=False)
    broker = f"{REDIS_BASE}/{BROKER_DB}"
    app.conf.update(
        reliable(broker_url=broker, store_url=store_database, result_backend=broker),
        conventions_workloads={"email": queue},
        task_default_queue=queue,
        conventions_doctor_levels={"redis-no-persistence": "warning"},
    )

    def body(payload: Item, ctx: JobContext) -> str:
        return payload.item_id

    job = app.job(TASK, payload=Item, key="runs-order:{item_id}", workload="email",
                  dedup=None)(body)  # fmt: skip
    yield app, job
    app.store.close()
    app.close()


def test_a_published_event_written_after_a_real_worker_finished_leaves_the_run_succeeded(
    sql_app: tuple[App, Any],
) -> None:
    from celery.contrib.testing.worker import start_worker

    from conventions.testing.worker import own_event_loop

    app, job = sql_app
    store = app.store
    assert isinstance(store, SQLStore)
    counts = store.counts
    holder = store.engine.connect()
    hold = holder.begin()
    # the row the publisher's ``published`` must update: locked until we let go
    holder.execute(sa.insert(counts).values(name=f"published|{TASK}", value=0))
    published: list[Any] = []
    queues = [app.conf.task_default_queue]
    with own_event_loop(), start_worker(
        app, pool="threads", concurrency=1, queues=queues,
        perform_ping_check=False, loglevel="WARNING", shutdown_timeout=20,
    ):  # fmt: skip
        publisher = threading.Thread(
            target=lambda: published.append(job.delay(item_id="i1")), daemon=True
        )
        publisher.start()
        run = wait_for(lambda: _final(store), timeout=30)  # the worker finished first
        assert not published  # the publisher still waits to write ``published``
        hold.rollback()
        holder.close()
        publisher.join(timeout=30)
    assert published and run.id == published[0].id
    events = [e.event for e in store.audit_for(run.correlation_id or "")]
    assert sorted(events) == ["published", "started", "succeeded"]  # published, too: last
    final = store.get_run(run.id)
    assert final is not None
    assert (final.state, final.live) == ("succeeded", False)
    assert final.ended_at is not None and final.created_at <= final.ended_at


def _final(store: SQLStore) -> Any:
    found = store.list_runs(task=TASK, limit=1)
    return found[0] if found and found[0].state == "succeeded" else None
