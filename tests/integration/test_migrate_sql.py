"""``conventions migrate`` on the SQL store (PostgreSQL and SQLite): step ``store_sql``
1 creates the schema; a database an earlier release made (today's tables, no stamp) is
recognized as version 1 and stamped, never re-created, and gets the columns it lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import sqlalchemy as sa

from conventions import App
from conventions.config import formats
from conventions.ops import doctor_formats
from conventions.store.sql import SQLStore, make_engine
from conventions.store.sql_stamps import SQLStamp
from tests.integration.support_migrate import migrate, new_app, postgres_url, redis_dbs, sql_url

__all__ = ["new_app", "postgres_url", "redis_dbs", "sql_url"]

Dbs = tuple[redis.Redis, redis.Redis]
NewApp = Callable[[str], App]


def tables(url: str) -> set[str]:
    engine = make_engine(SQLStoreURL(url))
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def SQLStoreURL(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def earlier_release(url: str) -> None:
    """A database as a release before the stamp left it: today's tables (less the
    ledger's fingerprint column, added later), one ledger row, no stamp table."""
    store = SQLStore(SQLStoreURL(url))
    store.engine  # noqa: B018  # creates the tables
    with store._engine.begin() as conn:
        conn.exec_driver_sql('DROP TABLE "cc_schema"')
        conn.exec_driver_sql('ALTER TABLE "cc_ledger" DROP COLUMN "fingerprint"')
        conn.exec_driver_sql(
            "INSERT INTO cc_ledger (key, state, owner, lease_until, updated_at) "
            "VALUES ('k1', 'done', 'w1', '2999-01-01 00:00:00', '2026-01-01 00:00:00')"
        )
    store.close()


def test_dry_run_on_an_empty_database_lists_the_schema_and_creates_nothing(
    redis_dbs: Dbs, new_app: NewApp, sql_url: str, capsys: Any
) -> None:
    code, out, _ = migrate(new_app(sql_url), capsys=capsys)

    assert code == 0
    assert "step store_sql 1: create the schema" in out
    assert "create table cc_ledger" in out
    assert "create table cc_schema" in out
    assert tables(sql_url) == set()


def test_apply_creates_the_schema_stamps_it_and_a_rerun_has_nothing_to_do(
    redis_dbs: Dbs, new_app: NewApp, sql_url: str, capsys: Any
) -> None:
    app = new_app(sql_url)

    code, out, _ = migrate(app, "--apply", "--actor", "ops-anna", capsys=capsys)
    again, out_again, _ = migrate(app, "--apply", capsys=capsys)

    assert code == again == 0, out
    assert {"cc_ledger", "cc_dedup", "cc_audit", "cc_runs", "cc_schema"} <= tables(sql_url)
    engine = make_engine(SQLStoreURL(sql_url))
    assert SQLStamp(engine).read() == {"store_sql": "1"}
    engine.dispose()
    events = [e for e in app.store.audit_for("migrate") if e.detail["format"] == "store_sql"]
    assert len(events) == 1
    assert events[0].detail["actor"] == "ops-anna"
    assert "created table cc_ledger" in events[0].detail["changed"]
    assert "nothing to do" in out_again


def test_an_earlier_releases_database_is_recognized_as_version_1_not_recreated(
    redis_dbs: Dbs, new_app: NewApp, sql_url: str, capsys: Any
) -> None:
    earlier_release(sql_url)
    app = new_app(sql_url)

    dry, dry_out, _ = migrate(app, capsys=capsys)
    code, out, _ = migrate(app, "--apply", capsys=capsys)

    assert dry == code == 0, out
    assert "create column cc_ledger.fingerprint" in dry_out
    assert "create table cc_schema" in dry_out
    assert "create table cc_ledger" not in dry_out
    engine = make_engine(SQLStoreURL(sql_url))
    with engine.connect() as conn:
        kept = conn.exec_driver_sql("SELECT key, owner FROM cc_ledger").all()
    columns = {c["name"] for c in sa.inspect(engine).get_columns("cc_ledger")}
    assert SQLStamp(engine).read() == {"store_sql": "1"}
    engine.dispose()
    assert [tuple(row) for row in kept] == [("k1", "w1")]
    assert "fingerprint" in columns


def test_the_store_stamps_a_database_it_creates_at_its_first_use(sql_url: str) -> None:
    store = SQLStore(SQLStoreURL(sql_url))

    store.key_state("any")

    assert SQLStamp(store._engine).read() == {"store_sql": "1"}
    store.close()


def test_a_database_stamped_by_a_newer_release_is_refused_by_migrate_and_the_doctor(
    redis_dbs: Dbs, new_app: NewApp, sql_url: str, capsys: Any
) -> None:
    engine = make_engine(SQLStoreURL(sql_url))
    SQLStamp(engine).stamp_missing("store_sql", formats.current("store_sql") + 1)
    engine.dispose()
    app = new_app(sql_url)

    code, _, err = migrate(app, "--apply", capsys=capsys)
    found = doctor_formats.format_findings(app, write=True)

    assert code == 1
    assert "store_sql 2 is newer than this release" in err
    assert [(f.level, f.code) for f in found] == [("error", "format-newer-than-release")]
    assert tables(sql_url) == {"cc_schema"}  # nothing else was created
