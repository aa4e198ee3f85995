"""A pool child's first job while the SQL store does not answer: the job is kept, not
failed, and runs once when the store is back. Real ``celery worker`` (prefork), real
PostgreSQL behind a proxy the test cuts (``CutProxy``), never a mock."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from kombu import Connection, Producer

from conventions.store.sql import SQLStore
from tasks import app
from tests.conftest import PG_BASE
from tests.integration.helpers import CutProxy, publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

ADMIN_URL = PG_BASE.replace("postgresql+psycopg://", "postgresql://") + "/postgres"


@pytest.fixture
def store_database() -> Iterator[str]:
    """A fresh PostgreSQL database for the layer's store, dropped afterwards."""
    name = f"cc_store_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_proxy() -> Iterator[CutProxy]:
    proxy = CutProxy(int(PG_BASE.rsplit(":", 1)[1]))
    yield proxy
    proxy.close()


def test_a_first_job_while_the_sql_store_is_unreachable_is_kept_and_runs_once(
    worker_process: object, pg_proxy: CutProxy, store_database: str
) -> None:
    pg_proxy.cut()  # down before the worker and its pool child ever reach it
    url = pg_proxy.url("postgresql", f"/{store_database}").replace("://", "://postgres@", 1)
    worker = worker_process("sql_down", "email", concurrency=1, CONVENTIONS_STORE_URL=url)  # type: ignore[operator]
    with Connection(app.conf.broker_url) as conn:
        task_id = publish_foreign(
            Producer(conn), "testing.echo.v1", {"call_id": "first_1"}, "email"
        )
    kept = "the store is unavailable"  # the run path's defer, logged by the child
    wait_for(lambda: kept in worker.output() or app.AsyncResult(task_id).state == "FAILURE")
    assert app.AsyncResult(task_id).state != "FAILURE", worker.output()[-3000:]
    pg_proxy.restore()
    assert app.AsyncResult(task_id).get(timeout=60)["call_id"] == "first_1"
    direct = SQLStore(f"{PG_BASE}/{store_database}")
    try:
        events = [e.event for e in direct.audit_for(_correlation(direct, task_id))]
    finally:
        direct.close()
    assert events.count("succeeded") == 1, events


def _correlation(store: SQLStore, task_id: str) -> str:
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        found = conn.execute(
            sa.select(store.audit.c.correlation_id).where(store.audit.c.data.contains(task_id))
        ).first()
    assert found is not None
    return str(found[0])
