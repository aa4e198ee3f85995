"""The reference shop's worker app: ``App("tasks")``, its settings and its schedule.

``celery -A tasks worker -Q email,heavy`` finds it as ``tasks.app`` (``tasks/__init__``
loads this module on first use). The job bodies live in ``tasks.payments``,
``tasks.receipts`` and ``tasks.reports``, which import this module for ``app``; this
module never imports them back: Celery's ``include=`` names them, and Celery imports them
where it needs the bodies (a worker at start, ``tasks.app`` for every other user). A web
process that only publishes imports ``tasks.publishing`` instead, which needs none of the
bodies.
"""

from __future__ import annotations

from conventions import App
from conventions.schedules import watchdog

#: the modules whose jobs this app runs (Celery imports them: no import circle)
JOB_MODULES = ("tasks.payments", "tasks.receipts", "tasks.reports")

app = App("tasks", include=list(JOB_MODULES))
app.config_from_object("celeryconfig")
watchdog.register(app)  # ops.watchdog.v1, scheduled by celeryconfig's SCHEDULE

__all__ = ["JOB_MODULES", "app"]
