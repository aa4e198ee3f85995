"""The migrate's registry: every format a place keeps has one step for each version
from 1 to this release's, so that any stamped version reaches it; and the Django
outbox's table is Django's: its migrations match its model."""

from __future__ import annotations

import subprocess
import sys

from conventions.config import formats
from conventions.upgrade import places, steps

#: Django's ``makemigrations --check`` on the outbox app alone, on an in-memory SQLite
MAKEMIGRATIONS = """
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["conventions.contrib.django_outbox"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()
from django.core.management import call_command
call_command("makemigrations", "django_outbox", "--check", "--dry-run", verbosity=1)
"""


def test_every_format_has_a_step_to_each_version_up_to_this_releases() -> None:
    registry = steps.load()

    for kind, name in places.FORMATS.items():
        versions = [s.version for s in registry if s.kind == kind and s.format == name]
        assert versions == list(range(1, formats.current(name) + 1)), (kind, name)


def test_a_step_registered_again_replaces_the_first() -> None:
    first = steps.Step("redis_store", "test_twice", 1, "one", lambda p, c: [], lambda p, g: [])
    second = steps.Step("redis_store", "test_twice", 1, "two", lambda p, c: [], lambda p, g: [])
    try:
        steps.register(first)
        steps.register(second)
        found = [s.title for s in steps.load() if s.format == "test_twice"]
    finally:
        steps.unregister(second)

    assert found == ["two"]
    assert not [s for s in steps.load() if s.format == "test_twice"]


def test_the_django_outboxs_migrations_match_its_model() -> None:
    done = subprocess.run(
        [sys.executable, "-c", MAKEMIGRATIONS], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "No changes detected" in done.stdout
