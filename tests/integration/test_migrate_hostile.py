"""``conventions migrate`` and the doctor against stamps and options the layer never
writes: a version that is not a whole number is refused in one line, never read as
unstamped nor overwritten; a lock whose expiry is not a time is refused in one line;
``--wait`` and ``--lock-ttl`` that are not finite numbers in range are usage errors.
Each on real Redis, the migrate in-process or as a real ``python -m conventions``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from conventions import App
from conventions.ops import doctor_formats
from conventions.store.sql import make_engine
from conventions.store.sql_stamps import SQLStamp
from tests.integration.support_migrate import (
    STORE,
    migrate,
    new_app,
    postgres_url,
    probe_app,
    redis_dbs,
    spawn,
    sql_url,
)

__all__ = ["new_app", "postgres_url", "redis_dbs", "sql_url"]

Dbs = tuple[redis.Redis, redis.Redis]
NewApp = Callable[[str], App]

#: stamps the layer never writes: no whole number, each of them
NOT_VERSIONS = ["2.0", "abc", "-1", " 1", "1e3", ""]
#: the longest a refused option may take to be refused (a hang guard: no lock is waited)
GUARD = 30.0


@pytest.mark.parametrize("stamp", NOT_VERSIONS)
def test_a_stamp_that_is_not_a_version_is_refused_in_one_line_and_never_overwritten(
    stamp: str, redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    _, store = redis_dbs
    store.hset("cc:format", "store_redis", stamp)
    app = new_app(STORE)

    code, out, err = migrate(app, "--apply", capsys=capsys)
    found = doctor_formats.format_findings(app, write=True)  # as at worker start

    assert code == 1, out + err
    assert err == (
        f"conventions: error: migrate: redis cc:format: store_redis is stamped {stamp!r}, "
        "not a format version (a whole number): refused, nothing overwritten; set it to "
        "the version the data is at (docs/howto/migrate.md)\n"
    )
    assert [(f.level, f.code) for f in found] == [("error", "format-stamp-invalid")]
    assert repr(stamp) in found[0].message
    assert store.hgetall("cc:format") == {"store_redis": stamp}
    assert app.store.audit_for("migrate") == []


def test_a_sql_stamp_that_is_not_a_version_is_refused_and_never_overwritten(
    redis_dbs: Dbs, new_app: NewApp, sql_url: str, capsys: Any
) -> None:
    url = sql_url.replace("postgresql://", "postgresql+psycopg://", 1)
    stamp = SQLStamp(make_engine(url))
    stamp.ensure()
    with stamp.engine.begin() as conn:
        conn.execute(sa.insert(stamp.table).values(name="store_sql", value="2.0"))

    code, out, err = migrate(new_app(sql_url), "--apply", capsys=capsys)

    assert code == 1, out + err
    assert err.startswith(
        "conventions: error: migrate: sql cc_schema: store_sql is stamped '2.0', not a format "
        "version (a whole number): refused, nothing overwritten"
    )
    assert stamp.read() == {"store_sql": "2.0"}
    stamp.engine.dispose()


def test_a_stamp_that_is_not_a_version_under_json_answers_json_with_the_reason(
    redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    _, store = redis_dbs
    store.hset("cc:format", "store_redis", "2.0")

    code, out, err = migrate(new_app(STORE), "--apply", "--json", capsys=capsys)

    assert code == 1
    answer = json.loads(out)
    assert (answer["applied"], answer["ran"]) == (True, 0)
    assert "store_redis is stamped '2.0', not a format version" in answer["refused"]
    assert len(err.splitlines()) == 1
    assert store.hgetall("cc:format") == {"store_redis": "2.0"}


@pytest.mark.parametrize("until", ["abc", "inf", "nan"])
def test_a_lock_whose_expiry_is_not_a_time_is_refused_in_one_line(
    until: str, redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    _, store = redis_dbs
    held = {"lock": "elsewhere:1:ab", "lock_until": until}
    for field, value in held.items():  # on an unstamped store: a step to run
        store.hset("cc:format", field, value)

    code, out, err = migrate(new_app(STORE), "--apply", "--wait", "0", capsys=capsys)

    assert code == 1, out + err
    assert err == (
        "conventions: error: migrate: redis cc:format: the migrate lock of elsewhere:1:ab "
        f"has lock_until {until!r}, not a time (ms): refused, nothing overwritten; once no "
        "migrate runs, delete the fields lock and lock_until\n"
    )
    assert store.hgetall("cc:format") == held


@pytest.mark.parametrize(
    ("option", "value", "reason"),
    [
        ("--wait", "nan", "must be a finite number, got 'nan'"),
        ("--wait", "inf", "must be a finite number, got 'inf'"),
        ("--wait", "-1", "must be zero or more, got '-1'"),
        ("--lock-ttl", "nan", "must be a finite number, got 'nan'"),
        ("--lock-ttl", "inf", "must be a finite number, got 'inf'"),
        ("--lock-ttl", "1e300", "must be at most 86400, got '1e300'"),
    ],
)
def test_a_wait_or_lock_ttl_that_is_no_finite_number_in_range_is_one_line_and_exit_2(
    option: str, value: str, reason: str, redis_dbs: Dbs, tmp_path: Path
) -> None:
    _, store = redis_dbs
    # another migrate's lock, alive for a minute: a --wait that never ends would hang here
    store.eval(
        "local t = redis.call('TIME') redis.call('HSET', KEYS[1], 'lock', 'elsewhere', "
        "'lock_until', t[1] * 1000 + 60000)", 1, "cc:format",
    )  # fmt: skip
    before = store.hgetall("cc:format")

    process = spawn(probe_app(tmp_path, STORE, "redis_store"), "--apply", option, value)
    try:
        out, err = process.communicate(timeout=GUARD)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise

    assert process.returncode == 2, err[-3000:]
    assert out == ""
    assert err == (
        f"conventions: error: Invalid value for '{option}': {reason} "
        "(see conventions migrate --help)\n"
    )
    assert store.hgetall("cc:format") == before
