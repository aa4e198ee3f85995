"""Batches on the SQL store (PostgreSQL) with a real ``celery worker`` subprocess: the
member's end moves in the transaction of its completion or dead letter, the callbacks
run once, and a replayed member fires ``on_success``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from conventions.ops.replay import replay
from conventions.store import SQLStore
from tasks import app
from tests.conftest import PG_BASE
from tests.integration import support_batches as jobs
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.usefixtures("clean_store"), pytest.mark.timeout(180)]

ADMIN_URL = PG_BASE.replace("postgresql+psycopg://", "postgresql://") + "/postgres"


@pytest.fixture
def sql_store() -> Iterator[str]:
    """A PostgreSQL database of the test's own, as the app's store in this process."""
    name = f"cc_batches_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_BASE}/{name}"
    store = SQLStore(url)
    before = app.__dict__.get("_cc_store")
    app.__dict__["_cc_store"] = store
    try:
        yield url
    finally:
        app.__dict__.pop("_cc_store", None)
        if before is not None:
            app.__dict__["_cc_store"] = before
        store.close()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_on_sql_a_batch_with_a_dead_letter_completes_then_succeeds_after_the_replay(
    sql_store: str, worker_process: Callable[..., Any]
) -> None:
    worker_process(
        "batches-sql", "email", concurrency=4, include="tests.integration.support_batches",
        CONVENTIONS_STORE_URL=sql_store,
    )  # fmt: skip
    key = f"sql-{uuid.uuid4().hex[:8]}"
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    items = [f"{key}-{n}" for n in range(30)] + [f"bad-{key}"]
    for item in items:
        batch.add(jobs.batch_item, item_id=item)
    assert batch.submit().published == 31

    (complete,) = wait_for(lambda: jobs.runs(key), timeout=90)
    assert (complete["which"], complete["pending"], complete["succeeded"], complete["failed"]) == (
        "on_complete", 0, 30, 1,
    )  # fmt: skip
    (dead,) = complete["dead"]  # type: ignore[misc]

    app.store.put_state(jobs.FIXED + items[-1], {"fixed": True}, ttl=600)
    replay(app, str(dead), reason="fixed", actor="test")
    runs = wait_for(lambda: (r := jobs.runs(key)) and len(r) == 2 and r, timeout=90)
    assert runs[1]["which"] == "on_success"
    assert (runs[1]["succeeded"], runs[1]["failed"]) == (31, 0)
    status = wait_for(
        lambda: (s := app.store.get_batch(key)) and s.callback_states["on_success"] == "sent" and s
    )
    assert status.total == 31 and status.dead_letter_ids == []
    assert batch.submit().published == 0  # one batch, submitted whole
    assert len(jobs.runs(key)) == 2
