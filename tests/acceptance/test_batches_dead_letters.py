"""Every dead letter of a batch member ends it in its batch, whichever path writes it
(:mod:`conventions.worker.batch_ends`), on a real prefork worker and real Redis: a member
of a task the worker does not know (a deploy half-way), one whose payload it refuses (a
newer publisher's extra field), one too large to take, one written by a newer release.
Each is dead-lettered unrun, the batch ends, ``on_complete`` runs once with it failed,
``on_success`` never, and ``dead_letter_ids`` lists its record."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kombu import Connection, Producer

from conventions import JobContext
from conventions.config import formats
from conventions.store import batches as b
from conventions.store.records import Category
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration.helpers import publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

#: the worker imports these; it does not know ``batch_stranger`` below
INCLUDE = "tests.integration.support_jobs,tests.integration.support_batches"


@app.job("testing.batch_stranger.v1", payload=jobs.Item, key="stranger:{item_id}", workload="email")
def batch_stranger(payload: jobs.Item, ctx: JobContext) -> str:
    """A job this process declares and the worker (an older release) does not."""
    return "ok"


def _ended_once(key: str, succeeded: int) -> str:
    """The batch ended: ``on_complete`` ran once with one member failed, ``on_success``
    is still waiting; the id of the failed member's dead letter."""
    (complete,) = wait_for(lambda: jobs.runs(key), timeout=60, every=0.2)
    assert complete["which"] == "on_complete"
    assert (complete["pending"], complete["succeeded"], complete["failed"]) == (0, succeeded, 1)
    dead = [str(item) for item in complete["dead"]]  # type: ignore[attr-defined]
    assert len(dead) == 1
    dead_id = dead[0]
    status = wait_for(lambda: _sent(key, "on_complete"))
    assert status.callback_states["on_success"] == "waiting"
    assert status.dead_letter_ids == [dead_id]
    assert len(jobs.runs(key)) == 1
    return dead_id


def _sent(key: str, which: str) -> b.BatchStatus | None:
    status = app.store.get_batch(key)
    return status if status is not None and status.callback_states[which] == "sent" else None


def test_a_member_of_a_task_the_worker_does_not_know_ends_its_batch(
    worker_process: Callable[..., Any],
) -> None:
    worker_process("stranger", "email", concurrency=2, include=INCLUDE)
    key = f"stranger-{uuid.uuid4().hex[:8]}"
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in range(2):
        batch.add(jobs.batch_item, item_id=f"{key}-{n}")
    batch.add(batch_stranger, item_id=f"{key}-x")
    batch.submit()

    record = app.store.get_dead_letter(_ended_once(key, succeeded=2))
    assert record is not None
    assert (record.category, record.task) == (Category.INVALID, batch_stranger.name)
    assert "unknown task" in record.message
    assert record.headers[hdr.BATCH] == key


#: a member as a newer release publishes it: (extra kwargs, extra headers), the record's
#: category and a word of its reason
REFUSED = {
    "extra field": ({"note": "added in v1.1"}, {}, Category.INVALID, "note"),
    "too large": ({"blob": "x" * (1536 * 1024)}, {}, Category.INVALID, "over the cap"),
    "newer format": ({}, {hdr.FORMAT: formats.HEADERS + 1}, Category.NEWER_FORMAT, "version"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_member_the_worker_refuses_ends_its_batch(
    worker_process: Callable[..., Any], case: str
) -> None:
    extra, headers, category, word = REFUSED[case]
    worker_process("refuser", "email", concurrency=2, include=INCLUDE)
    key = f"refused-{uuid.uuid4().hex[:8]}"
    good, bad = f"{key}-0", f"{key}-bad"
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    batch.add(jobs.batch_item, item_id=good)
    batch.add(jobs.batch_item, item_id=bad)
    # what a newer release's submit() sends: the batch made, its members published with
    # cc_batch and their keys, one of them in a form this worker refuses
    app.store.create_batch(batch.spec())
    jobs.batch_item.apply_async(kwargs={"item_id": good}, headers={hdr.BATCH: key})
    with Connection(app.conf.broker_url) as conn:
        task_id = publish_foreign(
            Producer(conn), jobs.batch_item.name, {"item_id": bad, **extra}, "email",
            headers={
                hdr.BATCH: key, hdr.IDEMPOTENCY_KEY: f"batch-item:{bad}",
                "kwargsrepr": f"{{'item_id': {bad!r}}}", **headers,  # capped, as the layer's
            },
        )  # fmt: skip
    app.store.mark_batch_published(key)

    record = app.store.get_dead_letter(_ended_once(key, succeeded=1))
    assert record is not None
    assert (record.category, record.task_id) == (category, task_id)
    assert word in record.message
