"""The steps of the store on SQL (PostgreSQL, SQLite): its schema migrations.

``store_sql`` 1 creates the schema: every table of the store that is missing (with its
indexes) and every column added since a table's first release
(:data:`conventions.store.sql_tables.ADDED_COLUMNS`). A database that already has them
(made by an earlier release, before the stamp) is recognized as version 1: nothing is
re-created, it is stamped. The Django outbox's table is Django's (its migrations).
"""

from __future__ import annotations

from typing import Any

from conventions.upgrade.steps import Progress, Step, register


def missing(store: Any) -> list[str]:
    """What schema 1 lacks in the store's database: ``table X``, ``column X.Y``."""
    import sqlalchemy as sa

    from conventions.store.sql_tables import ADDED_COLUMNS

    inspector = sa.inspect(store._engine)
    tables = set(inspector.get_table_names())
    found = [f"table {name}" for name in store.metadata.tables if name not in tables]
    for suffix, column in ADDED_COLUMNS:
        name = f"{store.table_prefix}{suffix}"
        if name in tables and column not in {c["name"] for c in inspector.get_columns(name)}:
            found.append(f"column {name}.{column}")
    return found


def _preview(place: Any, cursor: str | None) -> list[str]:
    lacking = missing(place.handle)
    if not lacking:
        return ["nothing to create: today's tables are there (recognized as schema 1)"]
    return [f"create {what}" for what in lacking]


def _apply(place: Any, progress: Progress) -> list[str]:
    from conventions.store.sql_tables import add_missing_columns

    store = place.handle
    lacking = missing(store)
    try:
        store.metadata.create_all(store._engine, checkfirst=True)
    except Exception:  # another process created one between the check and the CREATE
        store.metadata.create_all(store._engine, checkfirst=True)
    add_missing_columns(store._engine, store.metadata, store.table_prefix)
    if not lacking:
        return ["nothing created: today's tables were there (recognized as schema 1)"]
    return [f"created {what}" for what in lacking]


CREATE = register(Step("sql_store", "store_sql", 1, "create the schema", _preview, _apply))
