"""``OutboxMessage``: Django's view of ``cc_outbox`` (``conventions.transactional.outbox.table``).

The columns match the SQLAlchemy table one for one, so the relay reads what Django
writes; ``tests/integration/test_outbox_examples.py`` checks it against PostgreSQL.
"""

from __future__ import annotations

from django.db import models

from conventions.transactional import outbox

_PENDING = models.Q(published_at__isnull=True)


class OutboxMessage(models.Model):  # type: ignore[misc]
    """One job to publish (see ``conventions.transactional.outbox``)."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(max_length=36, unique=True)
    task = models.CharField(max_length=255)
    kwargs = models.JSONField()
    headers = models.JSONField()
    idempotency_key = models.CharField(max_length=255)
    created_at = models.DateTimeField()
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    #: the relay gave up on the row and dead-lettered it (migration 0002)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = outbox.TABLE
        indexes = [
            models.Index(fields=["next_attempt_at"], name="cc_outbox_due", condition=_PENDING),
            models.Index(fields=["created_at"], name="cc_outbox_pending_age", condition=_PENDING),
            models.Index(fields=["published_at"], name="cc_outbox_published_at"),
        ]

    def __str__(self) -> str:
        state = "published" if self.published_at else "dead" if self.failed_at else "pending"
        return f"{self.task}[{self.task_id}] {state}"
