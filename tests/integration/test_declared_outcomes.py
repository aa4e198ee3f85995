"""What a worker says of a job that ends as declared, and of one whose return value
cannot be stored.

A declared dead letter (``PermanentError``) is an expected outcome: the worker's log has
one warning line naming the category and the record's id, and Celery's own line is
``raised expected`` at INFO without a traceback (it was ``raised unexpected`` at ERROR
with the whole traceback, for every card declined). A return value JSON cannot encode is
refused at the run, as a ``bug`` dead letter, in the test kit (here) and on a real
worker (``test_results``, Celery's worker in a thread): the run history and Celery tell
one story (it was ``succeeded`` in one, FAILURE in the other).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conventions import App, Id, JobContext, Payload
from conventions.config import profile
from conventions.store.records import Category
from conventions.testing import JobKit
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, wait_for


class Order(Payload):
    order_id: Id


def _lines_of(log: str, task_id: str) -> list[str]:
    return [line for line in log.splitlines() if task_id in line]


def test_a_declared_dead_letter_logs_one_warning_and_no_traceback_on_a_real_worker(
    worker_process: Callable[..., Any],
) -> None:
    worker = worker_process("declared", "email", concurrency=1)
    handle = support_jobs.declined.delay(call_id=f"call_{uuid.uuid4().hex[:10]}")
    record = wait_for(lambda: dead_letter_of(handle.id), timeout=60)
    # Celery's own line about the job comes last: wait for it
    log = wait_for(lambda: worker.output() if "raised expected" in worker.output() else None)

    mine = _lines_of(log, handle.id)
    warning = [line for line in mine if "dead-lettered as permanent" in line]
    assert len(warning) == 1 and "WARNING" in warning[0] and record.id in warning[0]
    assert "raised unexpected" not in log
    assert "Traceback" not in log
    assert not [line for line in mine if "ERROR" in line]
    assert record.category is Category.PERMANENT


def _kit_app() -> App:
    """An app of its own, configured for servers the kit never reaches."""
    app = App("declared_outcomes", set_as_current=False)
    unreachable = "redis://127.0.0.1:1"
    app.conf.update(
        profile.reliable(
            broker_url=f"{unreachable}/0",
            store_url=f"{unreachable}/1",
            result_backend=f"{unreachable}/1",
        ),
        conventions_workloads={"default": "kit"},
    )

    @app.job("kit.unstorable.v1", payload=Order, key="unstorable:{order_id}", workload="default")
    def unstorable(payload: Order, ctx: JobContext) -> dict[str, object]:
        return {"order": payload.order_id, "handle": object()}

    return app


def test_the_kit_dead_letters_an_unstorable_return_value_as_a_bug(tmp_path: Path) -> None:
    with JobKit.open(_kit_app(), store_url=f"sqlite:///{tmp_path / 'store.db'}") as kit:
        run = kit.run("kit.unstorable.v1", order_id="ord_1")

        assert (run.outcome, run.state) == ("dead_lettered", "FAILURE")
        assert run.dead_letter is not None and run.dead_letter.category is Category.BUG
        assert "object" in run.dead_letter.message
        assert [e.event for e in run.events][-1] == "dead_lettered"
