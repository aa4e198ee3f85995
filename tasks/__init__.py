"""The reference Celery app: a small shop's background jobs.

``celery -A tasks worker -Q email,heavy`` serves every reference task: receipts on the
light ``email`` lane, payment events on it too, reports on the ``heavy`` lane.
"""

from __future__ import annotations

from conventions import App
from conventions.schedules import watchdog

app = App("tasks")
app.config_from_object("celeryconfig")

from tasks import payments, receipts, reports  # noqa: E402  (registers the tasks)

watchdog.register(app)  # ops.watchdog.v1, scheduled by celeryconfig's SCHEDULE

__all__ = ["app", "payments", "receipts", "reports"]
