"""On RabbitMQ too, a worker refuses a message written by a newer release (its
``cc_format``) before anything runs: a ``newer_format`` dead letter, the job never ran.
Real RabbitMQ (quorum queues), a real ``celery worker`` subprocess of the quorum app."""

from __future__ import annotations

import uuid

import pytest

from conventions.config import formats
from conventions.store.records import Category
from tests.integration import support_rabbit_quorum as q
from tests.integration.helpers import dead_letter_of, wait_for
from tests.integration.test_rabbitmq_quorum import Worker, _ran, broker, worker

__all__ = ["broker", "worker"]  # the module's RabbitMQ and worker fixtures, shared


def test_a_newer_message_format_is_dead_lettered_on_rabbitmq_and_never_runs(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = f"f{uuid.uuid4().hex[:8]}"
    with monkeypatch.context() as release:
        release.setattr(formats, "HEADERS", formats.HEADERS + 1)
        sent = q.ran.delay(item_id=item)
    record = wait_for(lambda: dead_letter_of(str(sent.id)), timeout=60)
    assert record.category is Category.NEWER_FORMAT
    assert "replay once the fleet runs the new release" in record.message
    assert record.payload == {"item_id": item}
    probe = f"p{uuid.uuid4().hex[:8]}"  # one slot: the probe runs after the refusal
    q.ran.delay(item_id=probe)
    wait_for(lambda: _ran(probe), timeout=30)
    assert _ran(item) == []
