"""The shop database as the jobs see it: one engine per process, made lazily.

Engines are not fork-safe, so a prefork child builds its own (``worker_process_init``
drops any engine inherited from the parent).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import signals
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from conventions.transactional import once
from tasks import shop

_engine: Engine | None = None


def engine() -> Engine:
    """The process's engine for ``shop_database_url``; the schema is created once."""
    global _engine  # noqa: PLW0603  (one engine per process, reset after fork)
    if _engine is None:
        from tasks import app

        _engine = shop.make_engine(str(app.conf.shop_database_url))
        shop.create_schema(_engine)
        once.create_table(_engine)
    return _engine


@contextmanager
def transaction() -> Iterator[Session]:
    """A session in a transaction: committed on success, rolled back on error."""
    with Session(engine(), expire_on_commit=False) as session, session.begin():
        yield session


def _forget_inherited_engine(**_: Any) -> None:
    global _engine  # noqa: PLW0603  (one engine per process, reset after fork)
    _engine = None


signals.worker_process_init.connect(_forget_inherited_engine)
