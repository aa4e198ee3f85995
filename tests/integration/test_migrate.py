"""``conventions migrate`` on real Redis: the dry run changes nothing, ``--apply`` stamps
and audits, a re-run has nothing to do, and the doctor reads the stamps (a newer one
refuses, a pending one names the command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from conventions import App
from conventions.config import formats
from conventions.ops import doctor_formats
from conventions.upgrade import places
from conventions.worker import lifecycle
from tests.integration.support_migrate import (
    HANG_GUARD,
    STORE,
    migrate,
    new_app,
    probe_app,
    redis_dbs,
)

__all__ = ["new_app", "redis_dbs"]

Dbs = tuple[redis.Redis, redis.Redis]
NewApp = Callable[[str], App]


def snapshot(*clients: redis.Redis) -> list[dict[str, Any]]:
    return [{key: client.dump(key) for key in client.keys("*")} for client in clients]


def test_dry_run_lists_the_steps_and_changes_nothing(
    redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    broker, store = redis_dbs
    store.set("cc:ledger:email.send:receipt:1", "x")  # a store an earlier release wrote
    before = snapshot(broker, store)

    code, out, _ = migrate(new_app(STORE), capsys=capsys)

    assert code == 0
    assert "step store_redis 1: recognize the store's keys as layout 1" in out
    assert "step transport_layout 1" in out
    assert "2 step(s) to run: this was a dry run, nothing changed" in out
    assert snapshot(broker, store) == before


def test_apply_stamps_each_place_and_audits_each_step_with_the_actor(
    redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    broker, store = redis_dbs
    app = new_app(STORE)

    code, out, _ = migrate(app, "--apply", "--actor", "ops-anna", "--reason", "v0.2", capsys=capsys)

    assert code == 0, out
    assert store.hgetall("cc:format") == {"store_redis": "1"}
    assert broker.hgetall("_cc.format") == {"transport_layout": "1"}
    events = app.store.audit_for("migrate")
    assert [(e.event, e.detail["format"], e.detail["version"]) for e in events] == [
        ("format_migrated", "store_redis", 1),
        ("format_migrated", "transport_layout", 1),
    ]
    assert {(e.detail["actor"], e.detail["reason"]) for e in events} == {("ops-anna", "v0.2")}


def test_a_second_run_has_nothing_to_do_and_changes_nothing(
    redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    broker, store = redis_dbs
    app = new_app(STORE)
    assert migrate(app, "--apply", capsys=capsys)[0] == 0
    before = snapshot(broker, store)

    code, out, _ = migrate(app, "--apply", capsys=capsys)

    assert code == 0
    assert "nothing to do" in out
    assert snapshot(broker, store) == before
    assert len(app.store.audit_for("migrate")) == 2


def test_a_store_stamped_by_a_newer_release_is_refused_by_migrate_and_the_doctor(
    redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    _, store = redis_dbs
    store.hset("cc:format", "store_redis", formats.current("store_redis") + 1)
    app = new_app(STORE)

    code, _, err = migrate(app, "--apply", capsys=capsys)
    found = doctor_formats.format_findings(app, write=True)

    assert code == 1
    assert "newer than this release" in err
    assert [(f.level, f.code) for f in found] == [("error", "format-newer-than-release")]


def test_a_refusal_under_json_answers_json_with_the_reason_and_exit_1(
    redis_dbs: Dbs, new_app: NewApp, capsys: Any
) -> None:
    _, store = redis_dbs
    store.hset("cc:format", "store_redis", formats.current("store_redis") + 1)

    code, out, err = migrate(new_app(STORE), "--apply", "--json", capsys=capsys)

    assert code == 1
    answer = json.loads(out)
    assert answer["applied"] is True and answer["ran"] == 0
    assert "newer than this release" in answer["refused"]
    assert {p["kind"] for p in answer["places"]} == {"redis_store", "transport"}
    assert "newer than this release" in err  # the one line on stderr, as without --json


def test_the_doctor_names_the_command_when_a_migration_is_pending(
    redis_dbs: Dbs, new_app: NewApp
) -> None:
    _, store = redis_dbs
    store.hset("cc:format", "store_redis", 0)  # older than this release reads

    found = doctor_formats.format_findings(new_app(STORE), write=True)

    assert [(f.level, f.code) for f in found] == [("error", "format-migration-pending")]
    assert "conventions migrate --apply" in found[0].message


def test_a_pending_migration_this_release_still_reads_is_a_warning(
    redis_dbs: Dbs, new_app: NewApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, store = redis_dbs
    store.hset("cc:format", "store_redis", 1)
    monkeypatch.setattr(formats, "STORE_REDIS", 2)  # a release that writes 2, reads 1

    found = doctor_formats.format_findings(new_app(STORE), write=False)

    assert [(f.level, f.code) for f in found] == [("warning", "format-migration-pending")]


def test_worker_start_stamps_an_unstamped_store_at_the_recognized_version(
    redis_dbs: Dbs,
    new_app: NewApp,
) -> None:
    broker, store = redis_dbs

    found = doctor_formats.format_findings(new_app(STORE), write=True)

    assert found == []
    assert store.hgetall("cc:format") == {"store_redis": str(places.RECOGNIZED)}
    assert broker.hgetall("_cc.format") == {"transport_layout": str(places.RECOGNIZED)}


def test_conventions_doctor_reads_the_stamps_without_writing_them(
    redis_dbs: Dbs, new_app: NewApp
) -> None:
    _, store = redis_dbs

    found = doctor_formats.format_findings(new_app(STORE), write=False)

    assert found == []
    assert store.hgetall("cc:format") == {}


def test_a_real_worker_refuses_to_start_on_a_store_stamped_by_a_newer_release(
    redis_dbs: Dbs, tmp_path: Path
) -> None:
    _, store = redis_dbs
    store.hset("cc:format", "store_redis", formats.current("store_redis") + 1)
    probe_app(tmp_path, STORE, "redis_store")
    # without DJANGO_SETTINGS_MODULE (tests/unit/test_web.py sets it): Celery's Django
    # fixup would load those settings in the worker
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(tmp_path)

    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "migrate_probe", "worker", "--pool", "solo",
         "--loglevel", "WARNING"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD, check=False,
    )  # fmt: skip

    assert done.returncode == lifecycle.EX_CONFIG, done.stderr[-2000:]
    assert "format-newer-than-release" in done.stderr
