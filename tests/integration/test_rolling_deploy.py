"""A rolling deploy: a newer producer's message reaches an older worker that refuses it.
Real worker (threads), real Redis; the newer producer is a raw publish that reserves its
key as the layer's ``.delay()`` does."""

from __future__ import annotations

import uuid

import pytest
from kombu import Connection, Producer

from conventions.errors import PayloadError
from conventions.ops.replay import replay
from conventions.store import keys
from conventions.store.records import Category
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration import support_jobs
from tests.integration.helpers import dead_letter_of, publish_foreign, wait_for

pytestmark = pytest.mark.usefixtures("clean_store", "thread_worker")


def _newer_producer_sends(call_id: str, **extra: str) -> str:
    """``.delay()`` as a newer release would: the key reserved for the job id, then the
    message with the key header and a field the older worker's model does not know."""
    echo = support_jobs.echo
    bare = echo.key_for(echo.payload.parse({"call_id": call_id}))
    task_id = str(uuid.uuid4())
    assert app.store.reserve(keys.namespaced(echo.name, bare), task_id, 3600.0) is None
    with Connection(app.conf.broker_url) as conn:
        publish_foreign(
            Producer(conn), echo.name, {"call_id": call_id, **extra}, "email",
            headers={hdr.IDEMPOTENCY_KEY: bare}, task_id=task_id,
        )  # fmt: skip
    return task_id


def test_a_newer_producers_message_refused_as_invalid_frees_its_key() -> None:
    task_id = _newer_producer_sends("deploy_1", note="added in v1.1")
    record = wait_for(lambda: dead_letter_of(task_id))
    assert record.category is Category.INVALID
    assert record.idempotency_key is None  # the old worker could not derive it
    # a replay before the upgrade is refused at publish (the payload is validated
    # again, the key derived from it as .delay() does): nothing enqueued, no key taken
    with pytest.raises(PayloadError, match="note"):
        replay(app, record.id, reason="too early", actor="test")
    # the reservation went with the dead letter: the next call publishes and runs
    later = support_jobs.echo.delay(call_id="deploy_1")
    assert later.deduplicated is False
    assert later.get(timeout=30)["call_id"] == "deploy_1"


def test_an_invalid_dead_letter_keeps_its_kwargs_scrubbed_and_its_ids() -> None:
    task_id = _newer_producer_sends(
        "deploy_2", note="write to ann@example.com", card="4111 1111 1111 1111"
    )
    record = wait_for(lambda: dead_letter_of(task_id))
    assert record.category is Category.INVALID
    assert record.payload == {"call_id": "deploy_2", "note": "write to <email>", "card": "<number>"}


def test_a_refused_message_cannot_free_a_key_another_job_holds() -> None:
    echo = support_jobs.echo
    bare = echo.key_for(echo.payload.parse({"call_id": "deploy_3"}))
    key = keys.namespaced(echo.name, bare)
    assert app.store.reserve(key, "someone-else", 3600.0) is None
    with Connection(app.conf.broker_url) as conn:
        task_id = publish_foreign(
            Producer(conn), echo.name, {"call_id": "deploy_3", "extra": "x"}, "email",
            headers={hdr.IDEMPOTENCY_KEY: bare},
        )  # fmt: skip
    wait_for(lambda: dead_letter_of(task_id))
    assert app.store.reserve(key, "a-third-job", 3600.0) == "someone-else"
