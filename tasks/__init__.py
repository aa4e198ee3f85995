"""The reference Celery app: a small shop's background jobs.

``celery -A tasks worker -Q email,heavy`` serves every reference task: receipts on the
light ``email`` lane, payment events on it too, reports on the ``heavy`` lane.

This package is light on purpose: importing ``tasks.contracts`` (what a web process
needs to publish, see ``tasks.publishing``) imports neither the worker app nor the job
bodies nor what they import (SQLAlchemy, the mail client). The worker app lives in
``tasks.celery`` and is loaded on first use of ``tasks.app`` (Celery's ``-A tasks`` reads
that attribute).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.celery import app as app

#: what ``tasks.<name>`` loads the worker app for (the app and its job modules)
_WORKER = ("app", "payments", "receipts", "reports")


def __getattr__(name: str) -> Any:
    if name in _WORKER:
        from tasks import celery

        # the job modules register their bodies on the app: Celery imports them (the
        # app's ``include=``), as a worker does at start, for every user of ``tasks.app``
        celery.app.loader.import_default_modules()
        found = celery.app if name == "app" else importlib.import_module(f"tasks.{name}")
        globals()[name] = found  # once: later reads find the attribute itself
        return found
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")


__all__ = ["app", "payments", "receipts", "reports"]
