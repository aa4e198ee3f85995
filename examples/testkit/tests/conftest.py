"""The shop's test fixtures. The kit's own (``cc_kit``, ``cc_worker``, ...) come from the
``celery-conventions`` pytest plugin; ``cc_app = "tasks:app"`` in pyproject.toml names the
app they run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tasks import imports, reports
from tasks.mailer import mailer
from tasks.orders import create_tables


@pytest.fixture(autouse=True)
def fresh_shop() -> Iterator[None]:
    """Each test starts with no e-mail sent, no report made, no feed imported."""
    mailer.reset()
    reports.MADE.clear()
    imports.FEEDS.clear()
    imports.IMPORTED.clear()
    yield


@pytest.fixture
def shop_db(tmp_path: Path) -> Iterator[sa.Engine]:
    """The shop's own database (its orders and the outbox), a SQLite file per test."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    create_tables(engine)
    yield engine
    engine.dispose()
