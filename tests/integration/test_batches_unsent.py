"""Batch members whose publish would send nothing, on real worker processes and a real
Redis: a key done already ends its member as succeeded at the submit; a key a job
outside the batch holds, or a queue bound the batch would cross, refuses the batch with
nothing published; one key twice in a batch tree is refused at ``add()``. Every batch
that is submitted ends, and its callbacks run once (issue 48, item 1)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from conventions.batches import members
from conventions.capacity import backpressure
from conventions.errors import ConfigurationError, KeyHeld, QueueOverCapacity
from conventions.store import batches as b
from conventions.task import DuplicateResult
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

INCLUDE = "tests.integration.support_batches"


def _id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _name_of(task: Any, **payload: Any) -> str:
    """A member's name: its namespaced idempotency key."""
    _, name, _ = task.prepare(payload, {})
    return str(name)


def _name(task: Any, item_id: str) -> str:
    return _name_of(task, item_id=item_id)


def _run_alone(task: Any, item_id: str) -> str:
    """Run ``task`` outside any batch until its key is done; its task id."""
    result = task.delay(item_id=item_id)
    assert result.get(timeout=60) == "ok"
    name = _name(task, item_id)
    wait_for(lambda: app.store.key_state(name).ledger_state == "done")
    return str(result.id)


@pytest.fixture
def queues(broker_redis: redis.Redis) -> Iterator[redis.Redis]:
    """The broker with the email and heavy queues emptied, before and after."""
    broker_redis.delete("email", "heavy")
    yield broker_redis
    broker_redis.delete("email", "heavy")


@pytest.fixture
def worker(worker_process: Callable[..., Any], queues: redis.Redis) -> Callable[[], Any]:
    """Start a prefork worker of the batch jobs (when the test wants it)."""
    return lambda: worker_process("unsent", "email,heavy", concurrency=2, include=INCLUDE)


@pytest.fixture
def bound_heavy() -> Iterator[Callable[..., None]]:
    """Bound the heavy queue for this test only."""
    before = app.conf.get("conventions_backpressure")

    def bound(**spec: Any) -> None:
        app.conf.update(conventions_backpressure={"heavy": spec})
        app.__dict__.pop("conventions_settings", None)
        backpressure.gauge.forget()

    yield bound
    app.conf.update(conventions_backpressure=before)
    app.__dict__.pop("conventions_settings", None)
    backpressure.gauge.forget()


def _callbacks_ran_once(batch_id: str, *which: str) -> b.BatchStatus:
    """Wait for the batch to end with its callbacks sent and run; each ran once."""

    def ended() -> b.BatchStatus | None:
        status = app.store.get_batch(batch_id)
        if status is None or not status.ended:
            return None
        return status if all(status.callback_states.get(w) == "sent" for w in which) else None

    status = wait_for(ended, timeout=60)
    wait_for(lambda: len(jobs.runs(batch_id)) >= len(which))
    assert sorted(str(run["which"]) for run in jobs.runs(batch_id)) == sorted(which)
    return status


def test_a_member_whose_key_a_job_outside_the_batch_holds_refuses_the_batch_whole(
    worker: Callable[[], Any], queues: redis.Redis
) -> None:
    key = _id("held")
    standalone = jobs.batch_item.delay(item_id=f"{key}-7")  # no worker yet: it waits
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in (6, 7, 8):
        batch.add(jobs.batch_item, item_id=f"{key}-{n}")

    with pytest.raises(KeyHeld, match=f"{key}-7") as caught:
        batch.submit()
    assert caught.value.holder == standalone.id
    # nothing of the batch: no record, no message, no reservation left behind
    assert app.store.get_batch(key) is None
    assert queues.llen("email") == 1
    assert app.store.key_state(_name(jobs.batch_item, f"{key}-6")).reserved_by is None
    assert app.store.key_state(_name(jobs.batch_item, f"{key}-8")).reserved_by is None

    worker()
    assert standalone.get(timeout=60) == "ok"
    submitted = batch.submit()  # its job done: the member is skipped as done, and counts
    assert (submitted.created, submitted.published) == (True, 3)
    status = _callbacks_ran_once(key, "on_complete", "on_success")
    assert (status.total, status.succeeded, status.failed) == (3, 3, 0)


@pytest.mark.parametrize("task", [jobs.batch_forever, jobs.batch_ttl], ids=["forever", "ttl"])
def test_a_member_whose_key_is_done_and_still_reserved_ends_as_succeeded_at_submit(
    worker: Callable[[], Any], task: Any
) -> None:
    key = _id(f"done-{task.dedup}")
    worker()
    first = _run_alone(task, f"{key}-7")
    done = _name(task, f"{key}-7")
    assert app.store.key_state(done).reserved_by == first  # kept by its dedup window
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in (6, 7, 8):
        batch.add(task, item_id=f"{key}-{n}")

    submitted = batch.submit()

    assert submitted.published == 2  # what was published: the done member was not
    assert app.store.get_batch(key).members[done] == ("s", first, "")  # type: ignore[union-attr]
    status = _callbacks_ran_once(key, "on_complete", "on_success")
    assert (status.total, status.succeeded, status.failed) == (3, 3, 0)
    assert len(jobs.runs(key)) == 2


def test_a_batch_that_would_cross_a_shedding_queue_bound_is_refused_whole(
    worker: Callable[[], Any], queues: redis.Redis, bound_heavy: Callable[..., None]
) -> None:
    key = _id("shed")
    bound_heavy(max_depth=2)
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in (6, 7, 8):
        batch.add(jobs.batch_shed, item_id=f"{key}-{n}")

    with pytest.raises(QueueOverCapacity, match="0 jobs waiting and 3 more, bound 2") as caught:
        batch.submit()
    assert caught.value.queue == "heavy"
    assert app.store.get_batch(key) is None
    assert queues.llen("heavy") == 0
    assert all(
        app.store.key_state(_name(jobs.batch_shed, f"{key}-{n}")).reserved_by is None
        for n in (6, 7, 8)
    )

    bound_heavy(max_depth=3)  # room for the whole batch
    submitted = batch.submit()
    assert submitted.published == 3
    assert queues.llen("heavy") == 3
    worker()
    status = _callbacks_ran_once(key, "on_complete", "on_success")
    assert (status.total, status.succeeded) == (3, 3)
    assert len(jobs.runs(key)) == 2


def test_a_member_shed_half_way_fails_the_submit_and_the_submit_made_again_ends_it(
    worker: Callable[[], Any],
    queues: redis.Redis,
    bound_heavy: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other producers filled the queue between the batch's admission and its publishes
    (here the admission lets everything by): the member shed raises, the batch is not
    marked published, and the same submit made again once there is room publishes it."""
    key = _id("shed-late")
    bound_heavy(max_depth=2)
    monkeypatch.setattr(backpressure, "room_for", lambda *_: None, raising=False)
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in (6, 7, 8):
        batch.add(jobs.batch_shed, item_id=f"{key}-{n}")

    with pytest.raises(QueueOverCapacity, match=f"{key}-8.* was shed"):
        batch.submit()
    status = app.store.get_batch(key)
    assert status is not None and not status.published
    assert queues.llen("heavy") == 2
    assert app.store.key_state(_name(jobs.batch_shed, f"{key}-8")).reserved_by is None

    bound_heavy(max_depth=10)
    again = batch.submit()  # 6 and 7 published again, with the same task ids
    assert (again.created, again.published) == (False, 3)
    worker()
    status = _callbacks_ran_once(key, "on_complete", "on_success")
    assert (status.total, status.succeeded) == (3, 3)
    assert len(jobs.runs(key)) == 2


def test_a_members_reservation_is_the_one_its_publish_makes(queues: redis.Redis) -> None:
    """The submit reserves a member's key before the publish, with the payload as the
    message carries it (defaults filled in): the same call outside the batch is a
    duplicate of the member, not a KeyConflict. (Passes on the code before the submit
    reserved first; it guards the reservation it takes now.)"""
    key = _id("same")
    batch = app.batch(key)
    batch.add(jobs.batch_success, batch_id=f"{key}-x")  # BatchDone.label has a default
    batch.submit()

    again = jobs.batch_success.delay(batch_id=f"{key}-x")

    assert isinstance(again, DuplicateResult)
    name = _name_of(jobs.batch_success, batch_id=f"{key}-x")
    assert again.id == members.member_task_id(key, name)


@pytest.mark.parametrize("where", ["parent-then-child", "child-then-parent", "siblings"])
def test_one_key_in_two_batches_of_one_tree_is_refused_at_add(
    worker: Callable[[], Any], where: str
) -> None:
    key = _id("twice")
    parent = app.batch(key, on_complete=jobs.batch_complete.s())
    first = parent.batch(f"{key}-a", on_complete=jobs.batch_complete.s())
    second = parent if where != "siblings" else parent.batch(f"{key}-b")
    if where == "parent-then-child":
        first, second = second, first
    first.add(jobs.batch_item, item_id=f"{key}-7")
    second.add(jobs.batch_item, item_id=f"{key}-8")

    with pytest.raises(ConfigurationError, match=f"{key}-7.*is a member of batch"):
        second.add(jobs.batch_item, item_id=f"{key}-7")

    worker()  # the tree as declared, without the refused member, ends
    submitted = parent.submit()
    assert submitted.published == 2
    _callbacks_ran_once(f"{key}-a", "on_complete")
    status = _callbacks_ran_once(key, "on_complete")
    assert status.failed == 0


def test_a_batch_whose_members_meet_every_case_ends_and_its_callbacks_run_once(
    worker: Callable[[], Any],
) -> None:
    """Members whose keys are done (until_done, forever, a TTL), fresh ones, and a nested
    batch whose every member is done already: it ends at the submit, in its parent."""
    key = _id("every")
    worker()
    done = (jobs.batch_item, jobs.batch_forever, jobs.batch_ttl)
    for task in done:
        _run_alone(task, f"{key}-done")
    _run_alone(jobs.batch_forever, f"{key}-child-done")
    parent = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for task in done:
        parent.add(task, item_id=f"{key}-done")
        parent.add(task, item_id=f"{key}-fresh")
    child = parent.batch(f"{key}-child", on_success=jobs.batch_success.s())
    child.add(jobs.batch_forever, item_id=f"{key}-child-done")

    submitted = parent.submit()

    # until_done's key is free again: published, skipped as done; forever and ttl: not
    assert submitted.published == 4
    (child_run,) = wait_for(lambda: (r := jobs.runs(f"{key}-child")) and r)
    assert (child_run["which"], child_run["succeeded"]) == ("on_success", 1)
    status = _callbacks_ran_once(key, "on_complete", "on_success")
    assert (status.total, status.succeeded, status.failed) == (7, 7, 0)
    assert len(jobs.runs(key)) == 2
    assert len(jobs.runs(f"{key}-child")) == 1
