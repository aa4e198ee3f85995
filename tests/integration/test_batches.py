"""Batches on a real worker and real Redis: the callbacks run once, after every member
ended, with the members' outcomes; a replayed member counts when it succeeds; nested
batches; a batch submitted twice is one batch; a callback a crash left due is swept."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from billiard.exceptions import TimeLimitExceeded

from conventions.batches import callbacks
from conventions.ops.replay import replay
from conventions.store import batches as b
from conventions.worker import reservations
from conventions.worker.delivery import dead_letter_hard_timeout
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


def _id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _ended(batch_id: str) -> b.BatchStatus | None:
    status = app.store.get_batch(batch_id)
    return status if status is not None and status.ended else None


def _runs(batch_id: str, count: int) -> list[dict[str, object]]:
    return wait_for(lambda: (r := jobs.runs(batch_id)) and len(r) >= count and r, timeout=60)


def test_both_callbacks_run_once_after_every_member_succeeded() -> None:
    key = _id("all-good")
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in range(20):
        batch.add(jobs.batch_item, item_id=f"{key}-{n}")
    submitted = batch.submit()
    assert (submitted.created, submitted.published) == (True, 20)

    runs = _runs(key, 2)
    assert sorted(run["which"] for run in runs) == ["on_complete", "on_success"]
    for run in runs:  # each ran after the last member ended, and saw the counts
        assert (run["pending"], run["succeeded"], run["failed"], run["ended"]) == (0, 20, 0, 20)
    status = wait_for(
        lambda: (s := _ended(key)) and set(s.callback_states.values()) == {"sent"} and s
    )
    assert (status.total, status.succeeded) == (20, 20)
    # submitted again: the same batch, nothing published, no callback more
    again = batch.submit()
    assert (again.created, again.published) == (False, 0)
    assert len(jobs.runs(key)) == 2


def test_dead_lettered_members_end_the_batch_and_a_replay_that_succeeds_fires_on_success() -> None:
    key = _id("two-bad")
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    items = [f"{key}-{n}" for n in range(8)] + [f"bad-{key}-a", f"bad-{key}-b"]
    for item in items:
        batch.add(jobs.batch_item, item_id=item)
    batch.submit()

    (complete,) = _runs(key, 1)
    assert complete["which"] == "on_complete"
    assert (complete["pending"], complete["succeeded"], complete["failed"]) == (0, 8, 2)
    dead = list(complete["dead"])  # type: ignore[call-overload]
    assert len(dead) == 2
    assert _ended(key).callback_states["on_success"] == "waiting"  # type: ignore[union-attr]

    for item in items[-2:]:  # fix them, and replay both dead letters
        app.store.put_state(jobs.FIXED + item, {"fixed": True}, ttl=600)
    replay(app, dead[0], reason="fixed", actor="test")
    wait_for(lambda: (s := app.store.get_batch(key)) and s.failed == 1)
    assert len(jobs.runs(key)) == 1  # one failure left: no success yet
    replay(app, dead[1], reason="fixed", actor="test")

    runs = _runs(key, 2)
    assert [run["which"] for run in runs] == ["on_complete", "on_success"]
    assert (runs[1]["pending"], runs[1]["succeeded"], runs[1]["failed"]) == (0, 10, 0)
    status = wait_for(
        lambda: (s := _ended(key)) and s.callback_states["on_success"] == "sent" and s
    )
    assert status.dead_letter_ids == []
    assert len(jobs.runs(key)) == 2  # on_complete did not run again


def test_a_nested_batch_counts_in_its_parent_once_it_has_ended() -> None:
    key = _id("parent")
    parent = app.batch(key, on_complete=jobs.batch_complete.s())
    for n in range(3):
        parent.add(jobs.batch_item, item_id=f"{key}-{n}")
    child = parent.batch(f"{key}-child", on_success=jobs.batch_success.s())
    for n in range(3):
        child.add(jobs.batch_item, item_id=f"{key}-child-{n}")
    parent.submit()

    (child_run,) = _runs(f"{key}-child", 1)
    (parent_run,) = _runs(key, 1)
    assert (child_run["which"], child_run["succeeded"]) == ("on_success", 3)
    assert (parent_run["pending"], parent_run["succeeded"], parent_run["ended"]) == (0, 4, 4)
    status = app.store.get_batch(key)
    assert status is not None and status.members[b.nested_member(f"{key}-child")][0] == "s"


def test_a_callback_left_due_by_a_crash_is_published_by_the_sweep_once() -> None:
    key = _id("swept")
    batch = app.batch(key, on_complete=jobs.batch_complete.s())
    batch.add(jobs.batch_item, item_id=f"{key}-0")
    spec = batch.spec()
    app.store.create_batch(spec)  # made, but its member ends here, as a worker killed
    fired = app.store.end_member(b.BatchMove((key,), spec.members[0], "s", "t-1"))
    assert fired == [f"{key}|on_complete"]  # ...right after the counter moved would
    assert app.store.due_callbacks(0) == [f"{key}|on_complete"]

    assert callbacks.sweep(app, grace=0) == 1
    assert callbacks.sweep(app, grace=0) == 0  # marked sent
    (run,) = _runs(key, 1)
    assert run["which"] == "on_complete"
    task_id = b.callback_task_id(key, "on_complete")
    first = wait_for(lambda: app.store.get_run(task_id))
    callbacks.publish_one(app, key, "on_complete")  # published once more: still one run
    wait_for(lambda: (r := app.store.get_run(task_id)) and r.updated_at != first.updated_at)
    assert len(jobs.runs(key)) == 1


def _made_due(key: str, **callbacks_: object) -> str:
    """A batch of one member whose end made its callbacks due, as a worker killed right
    after the counter moved leaves them; its member's name."""
    batch = app.batch(key, **callbacks_)
    batch.add(jobs.batch_item, item_id=f"{key}-0")
    spec = batch.spec()
    app.store.create_batch(spec)
    assert app.store.end_member(b.BatchMove((key,), spec.members[0], "s", f"t-{key}"))
    return str(spec.members[0])


def test_callbacks_that_can_never_be_published_become_dead_letters_and_block_no_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#48: a due callback whose task was renamed away (or whose payload is refused) was
    retried by every sweep for ever, and the sweep takes the oldest 100: 100 of them
    held back every other callback. Each becomes a dead letter of its own, leaves the
    sweep, and replays once its job is back."""
    gone = [_id(f"gone{n}") for n in range(100)]
    for key in gone:  # the oldest due: their on_success's task is gone from this fleet
        _made_due(key, on_success=jobs.batch_success.s())
    good = _id("good")
    _made_due(good, on_complete=jobs.batch_complete.s())
    monkeypatch.delitem(app.tasks, jobs.batch_success.name)

    published = [callbacks.sweep(app, grace=0) for _ in range(2)]

    assert published == [0, 1]  # the first sweep cleared the 100, the second sent the good
    (run,) = _runs(good, 1)
    assert run["which"] == "on_complete"
    assert app.store.due_callbacks(0) == []
    records = {
        record.task_id: record
        for record in app.store.list_dead_letters(task=jobs.batch_success.name, limit=200)
    }
    assert set(records) == {b.callback_task_id(key, "on_success") for key in gone}
    record = records[b.callback_task_id(gone[0], "on_success")]
    assert record.category.value == "invalid" and record.payload == {"batch_id": gone[0]}
    assert "cannot be published" in record.message and "not registered" in record.message
    assert callbacks.sweep(app, grace=0) == 0  # gone from the sweep: no second record
    assert len(records) == 100

    monkeypatch.undo()  # the job is back: its dead letter replays, and runs once
    replay(app, record.id, reason="job restored", actor="test")
    (replayed,) = _runs(gone[0], 1)
    assert replayed["which"] == "on_success"


@pytest.mark.parametrize("expired", [False, True], ids=["revoked", "expired"])
def test_a_revoked_or_expired_member_ends_failed_and_on_complete_runs_once(expired: bool) -> None:
    """The worker's ``task_revoked`` handler (``reservations.release``, what the signal
    calls in the main process) on a member that will never run: it ends failed, so the
    batch ends and ``on_complete`` runs; ``on_success`` never can."""
    key = _id("revoked")
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    batch.add(jobs.batch_item, item_id=f"{key}-0")
    batch.add(jobs.batch_item, item_id=f"{key}-1")
    spec = batch.spec()
    app.store.create_batch(spec)
    done, revoked = spec.members
    fired = app.store.end_member(b.BatchMove((key,), done, b.SUCCEEDED, "t-0"))
    assert fired == []  # one member still pending
    request = SimpleNamespace(kwargs={"item_id": f"{key}-1"}, cc_batch=key, retries=0)

    reservations.release(jobs.batch_item, "t-1", request, expired=expired, terminated=False)

    (run,) = _runs(key, 1)
    assert (run["which"], run["pending"], run["succeeded"], run["failed"]) == (
        "on_complete", 0, 1, 1,
    )  # fmt: skip
    status = wait_for(lambda: (s := _ended(key)) and s)
    assert status.members[revoked][0] == "f"
    assert status.callback_states["on_success"] == "waiting"


def test_a_member_killed_by_its_hard_limit_whose_payload_no_longer_parses_ends_failed() -> None:
    """``dead_letter_hard_timeout`` (what the worker's main process calls at the hard
    limit) on a member whose kwargs the worker's model refuses (a newer producer's): its
    key cannot be derived, so the member is named by the key its message carries."""
    key = _id("hard-unparsed")
    batch = app.batch(key, on_complete=jobs.batch_complete.s())
    batch.add(jobs.batch_item, item_id=f"{key}-0")
    spec = batch.spec()
    app.store.create_batch(spec)
    request = SimpleNamespace(
        id="t-hard", retries=0, hostname=None, delivery_info={},
        cc_batch=key, cc_idempotency_key=f"batch-item:{key}-0",
    )  # fmt: skip
    kwargs = {"item_id": f"{key}-0", "note": "a field of a newer release"}

    dead_letter_hard_timeout(jobs.batch_item, "t-hard", kwargs, TimeLimitExceeded(3.0), request)

    (run,) = _runs(key, 1)
    assert (run["which"], run["pending"], run["failed"]) == ("on_complete", 0, 1)
    (dead_id,) = run["dead"]  # type: ignore[misc]
    record = app.store.get_dead_letter(str(dead_id))
    assert record is not None and record.task_id == "t-hard"
    assert "hard time limit" in record.message
