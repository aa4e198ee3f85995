"""The console's batches pages against a real store: the list with members done, failed
and pending; one batch with its callbacks' states, its nested batch and its failed
members with their dead letters."""

from __future__ import annotations

import uuid
import warnings

import pytest

from conventions.console import Principal, Role, console_app
from conventions.store import batches as b
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration import support_console

pytestmark = pytest.mark.usefixtures("clean_store")


def test_the_batches_pages_show_counts_callbacks_and_the_failed_members() -> None:
    key = f"console-{uuid.uuid4().hex[:8]}"
    batch = app.batch(key, on_success=jobs.batch_success.s(), on_complete=jobs.batch_complete.s())
    for n in range(3):
        batch.add(jobs.batch_item, item_id=f"{key}-{n}")
    batch.add(jobs.batch_item, item_id=f"bad-{key}")
    child = batch.batch(f"{key}-child")
    child.add(jobs.batch_item, item_id=f"{key}-c")
    specs = [batch.spec(), child.spec()]
    for spec in specs:  # made, not published: the members end here
        app.store.create_batch(spec)
    names = specs[0].members
    app.store.end_member(b.BatchMove((key,), names[0], b.SUCCEEDED, "job-0"))
    app.store.end_member(b.BatchMove((key,), names[3], b.FAILED, "job-3", "dl-3"))

    with warnings.catch_warnings():  # starlette asks for httpx2 at import: not ours to fix
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    with TestClient(
        console_app(app, authorizer=lambda _: Principal("viewer", Role("read-only")))
    ) as client:
        listing = client.get("/batches")
        assert listing.status_code == 200
        assert f"/batches/{key}" in listing.text and "Batches" in listing.text
        page = client.get(f"/batches/{key}")
        assert page.status_code == 200
        text = page.text
        for field, value in (("total", 5), ("succeeded", 1), ("failed", 1), ("pending", 3)):
            assert f'id="{field}">{value}<' in text, field
        assert 'data-which="on_success"' in text and 'data-which="on_complete"' in text
        assert "waiting" in text
        assert f"/batches/{key}-child" in text  # the nested batch
        assert "/dead-letters/dl-3" in text and "/runs/job-3" in text  # failed first
        assert client.get("/batches/no-such-batch").status_code == 404
        assert client.get(f"/batches/{key}-child").text.count(key) >= 2  # names its parent


def test_the_batch_page_shows_member_keys_as_every_surface_does() -> None:
    """#48: a member key built from a ``sensitive()`` field, and one named with a card
    number, appeared whole to a read-only user at ``/batches/<id>``, where ``runs list``
    shows ``<redacted>`` (``observability.shown``)."""
    key = f"redacted-{uuid.uuid4().hex[:8]}"
    card = "4111111111111111"
    batch = app.batch(key, on_complete=jobs.batch_complete.s())
    batch.add(support_console.reset_link, user_id="u_1", reset_token=support_console.TOKEN)
    batch.add(jobs.batch_item, item_id=card)
    app.store.create_batch(batch.spec())  # made, not published: both members pending

    with warnings.catch_warnings():  # starlette asks for httpx2 at import: not ours to fix
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    with TestClient(
        console_app(app, authorizer=lambda _: Principal("viewer", Role("read-only")))
    ) as client:
        text = client.get(f"/batches/{key}").text
    assert 'id="pending">2<' in text
    assert support_console.TOKEN not in text and card not in text
    assert "reset:u_1:&lt;redacted&gt;" in text
