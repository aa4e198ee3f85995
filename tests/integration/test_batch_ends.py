"""#48 item 11: an operator sees a stuck batch (``conventions batches list|show``) and ends
its stuck member by hand (``batches end``, the console's batch page): through the store's
member-end step, audited with the actor and the reason, the callbacks it makes due
published and run once by a real (in-process) worker."""

from __future__ import annotations

import json
import uuid
import warnings
from typing import Any

import pytest

from conventions.batches.members import member_task_id
from conventions.cli.main import main
from conventions.console import console_app, csrf
from conventions.ops import batch_ends
from conventions.store import batches as b
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration.helpers import wait_for
from tests.integration.test_console import SECRET, TOKEN, by_headers

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


def _stuck(key: str, *, success: bool = True) -> tuple[str, str]:
    """A batch of three members, two ended, one pending for ever (its job was never
    published): its name and its job's task id."""
    callbacks: dict[str, Any] = {"on_complete": jobs.batch_complete.s()}
    if success:
        callbacks["on_success"] = jobs.batch_success.s()
    batch = app.batch(key, **callbacks)
    for n in range(3):
        batch.add(jobs.batch_item, item_id=f"{key}-{n}")
    spec = batch.spec()
    app.store.create_batch(spec)
    for n, name in enumerate(spec.members[:2]):
        app.store.end_member(b.BatchMove((key,), name, b.SUCCEEDED, f"job-{n}"))
    stuck = spec.members[2]
    return stuck, member_task_id(key, stuck)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["-A", "tasks", "batches", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _trail(key: str) -> list[Any]:
    events = app.store.audit_for(batch_ends.correlation(key))
    return [e for e in events if e.event == batch_ends.EVENT]


def test_the_cli_shows_a_stuck_batch_and_ends_its_member_by_hand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = f"stuck-{uuid.uuid4().hex[:8]}"
    name, job = _stuck(key)

    code, out, _ = _cli(capsys, "list", "--pending", "--json")
    assert code == 0
    (row,) = [r for r in json.loads(out) if r["id"] == key]
    assert (row["total"], row["succeeded"], row["pending"]) == (3, 2, 1)
    assert row["callbacks"] == {"on_success": "waiting", "on_complete": "waiting"}
    assert row["moved_at"] is not None and row["idle_seconds"] is not None
    code, out, _ = _cli(capsys, "list")
    assert code == 0 and key in out and "on_complete=waiting" in out

    code, out, _ = _cli(capsys, "show", key, "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["open_count"] == 1
    (member,) = shown["open_members"]
    assert (member["state"], member["task_id"], member["dead_letter_id"]) == ("pending", job, "")
    code, out, _ = _cli(capsys, "show", key)
    assert code == 0 and job in out and "pending" in out
    assert _cli(capsys, "show", "no-such-batch")[0] == 1

    # refused: a blank reason (usage), a member not in the batch
    code, _, err = _cli(capsys, "end", key, job, "--outcome", "failed", "--reason", " ")
    assert code == 2 and "--reason" in err
    code, _, err = _cli(capsys, "end", key, "nope", "--outcome", "failed", "--reason", "lost")
    assert code == 1 and "no member 'nope'" in err and len(err.strip().splitlines()) == 1
    assert not _trail(key)
    assert app.store.get_batch(key).pending == 1  # type: ignore[union-attr]

    code, out, _ = _cli(
        capsys, "end", key, job, "--outcome", "failed", "--reason", "job lost in the outage",
        "--actor", "ops-ann",
    )  # fmt: skip
    assert code == 0, out
    assert f"{key}|on_complete" in out

    (ran,) = wait_for(lambda: jobs.runs(key) or None, timeout=20)
    assert ran["which"] == "on_complete"
    assert (ran["pending"], ran["succeeded"], ran["failed"]) == (0, 2, 1)

    def ended() -> b.BatchStatus | None:
        found = app.store.get_batch(key)
        return found if found is not None and found.ended else None

    status = wait_for(ended, timeout=10)
    assert status.members[name][0] == b.FAILED
    assert status.callback_states["on_success"] == "waiting"  # a member failed
    wait_for(lambda: app.store.get_batch(key).callback_states["on_complete"] == "sent")  # type: ignore[union-attr]

    (event,) = _trail(key)
    assert (event.detail["actor"], event.detail["reason"]) == ("ops-ann", "job lost in the outage")
    assert (event.detail["outcome"], event.detail["member_task_id"]) == ("failed", job)
    assert event.task == "batch" and event.task_id == job

    # a member that is not pending any more: refused, one line, nothing changes
    code, _, err = _cli(capsys, "end", key, job, "--outcome", "succeeded", "--reason", "again")
    assert code == 1 and "not pending" in err and len(err.strip().splitlines()) == 1
    assert app.store.get_batch(key).members[name][0] == b.FAILED  # type: ignore[union-attr]
    assert len(_trail(key)) == 1
    code, out, _ = _cli(capsys, "list", "--pending", "--json")
    assert key not in [r["id"] for r in json.loads(out)]
    assert len(jobs.runs(key)) == 1  # on_complete ran once


def test_ending_a_nested_batchs_member_ends_the_child_and_moves_its_parent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = f"tree-{uuid.uuid4().hex[:8]}"
    parent = app.batch(key, on_complete=jobs.batch_complete.s())
    parent.add(jobs.batch_item, item_id=f"{key}-0")
    child = parent.batch(f"{key}-child", on_success=jobs.batch_success.s())
    child.add(jobs.batch_item, item_id=f"{key}-c")
    specs = [parent.spec(), child.spec()]
    for spec in specs:
        app.store.create_batch(spec)
    app.store.end_member(b.BatchMove((key,), specs[0].members[0], b.SUCCEEDED, "job-0"))
    name = specs[1].members[0]

    code, out, _ = _cli(
        capsys, "end", f"{key}-child", name, "--outcome", "succeeded", "--reason", "done by hand",
    )  # fmt: skip
    assert code == 0, out
    child_run = wait_for(lambda: jobs.runs(f"{key}-child") or None, timeout=20)
    parent_run = wait_for(lambda: jobs.runs(key) or None, timeout=20)
    assert [r["which"] for r in child_run] == ["on_success"]
    assert [r["which"] for r in parent_run] == ["on_complete"]
    status = app.store.get_batch(key)
    assert status is not None and status.members[b.nested_member(f"{key}-child")][0] == "s"


def test_the_console_ends_a_stuck_member_for_an_operator_with_a_reason() -> None:
    key = f"console-end-{uuid.uuid4().hex[:8]}"
    name, job = _stuck(key, success=False)

    with warnings.catch_warnings():  # starlette asks for httpx2 at import: not ours to fix
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    web = console_app(app, authorizer=by_headers, secret=SECRET)
    with TestClient(web) as http:
        viewer = {"x-test-actor": "vic", "x-test-role": "read-only"}
        page = http.get(f"/batches/{key}", headers=viewer)
        assert page.status_code == 200 and job in page.text
        assert 'action="/batches/end"' not in page.text  # no form for a read-only user
        # a valid token of the viewer's own: still refused, the role is too low
        signed = csrf.token(SECRET, http.cookies[csrf.COOKIE], "vic")
        form = {"batch_id": key, "member": job, "outcome": "succeeded", "reason": "lost",
                "csrf_token": signed}  # fmt: skip
        refused = http.post("/batches/end", data=form, headers=viewer)
        assert refused.status_code == 403 and "role is too low" in refused.text

        operator = {"x-test-actor": "opal", "x-test-role": "operator"}
        page = http.get(f"/batches/{key}", headers=operator)
        assert 'action="/batches/end"' in page.text and f'name="member" value="{job}"' in page.text
        token = TOKEN.search(page.text)
        assert token is not None
        form["csrf_token"] = token.group(1)
        no_token = {k: v for k, v in form.items() if k != "csrf_token"}
        assert http.post("/batches/end", data=no_token, headers=operator).status_code == 403
        blank = {**form, "reason": "  "}
        assert http.post("/batches/end", data=blank, headers=operator).status_code == 400
        other = {**form, "member": "nope"}
        assert http.post("/batches/end", data=other, headers=operator).status_code == 404
        assert app.store.get_batch(key).pending == 1  # type: ignore[union-attr]

        done = http.post("/batches/end", data=form, headers=operator, follow_redirects=False)
        assert done.status_code == 303, done.text
        after = http.get(done.headers["location"], headers=operator)
        assert after.status_code == 200 and 'id="ended"' in after.text
        assert 'id="pending">0<' in after.text
        again = http.post("/batches/end", data=form, headers=operator)
        assert again.status_code == 409

    (ran,) = wait_for(lambda: jobs.runs(key) or None, timeout=20)
    assert (ran["which"], ran["succeeded"], ran["pending"]) == ("on_complete", 3, 0)
    status = app.store.get_batch(key)
    assert status is not None and status.members[name][0] == b.SUCCEEDED
    (event,) = _trail(key)
    assert (event.detail["actor"], event.detail["reason"]) == ("opal", "lost")
