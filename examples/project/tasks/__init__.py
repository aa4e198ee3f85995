"""The example project's Celery app: ``celery -A tasks worker`` in this folder."""

from __future__ import annotations

from conventions import App

app = App("example_project")
app.config_from_object("celeryconfig")

from tasks import welcome  # noqa: E402  (registers the jobs)

__all__ = ["app", "welcome"]
