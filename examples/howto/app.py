"""The app of the how-to examples: a project's ``tasks/__init__.py``."""

from __future__ import annotations

from conventions import App

app = App("myproject")
app.config_from_object("celeryconfig")  # copy the reference celeryconfig.py
