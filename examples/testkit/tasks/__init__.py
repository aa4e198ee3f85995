"""The shop's Celery app: ``celery -A tasks worker -Q email,reports`` in this folder."""

from __future__ import annotations

from conventions import App

app = App("testkit_shop")
app.config_from_object("celeryconfig")

from tasks import imports, receipts, reports  # noqa: E402  (registers the jobs)

__all__ = ["app", "imports", "receipts", "reports"]
