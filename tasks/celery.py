"""The reference shop's worker app: ``App("tasks")`` and every job body it runs.

``celery -A tasks worker -Q email,heavy`` finds it as ``tasks.app`` (``tasks/__init__``
loads this module on first use). A web process that only publishes imports
``tasks.publishing`` instead, which needs none of the bodies.
"""

from __future__ import annotations

from conventions import App
from conventions.schedules import watchdog

app = App("tasks")
app.config_from_object("celeryconfig")

from tasks import payments, receipts, reports  # noqa: E402  (registers the jobs)

watchdog.register(app)  # ops.watchdog.v1, scheduled by celeryconfig's SCHEDULE

__all__ = ["app", "payments", "receipts", "reports"]
