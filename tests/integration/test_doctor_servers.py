"""The doctor asks each Redis server that keeps jobs for its settings: the broker's, and
a store on another server. Against real servers: the suite's, and one of the test's own
(started without persistence, as this machine's is)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from conventions import App
from conventions.ops.doctor import ERROR, WARNING, static_checks
from conventions.worker import lifecycle
from tests.conftest import BROKER_DB, REDIS_BASE
from tests.fixtures import unavailable
from tests.integration.helpers import SpareRedis


def test_a_store_on_another_redis_server_is_asked_for_its_settings_too(services: None) -> None:
    app = App("doctor_servers", set_as_current=False)
    app.conf.update(
        broker_url=f"{REDIS_BASE}/{BROKER_DB}",
        broker_transport="conventions.transport.redis:Transport",
        conventions_store_url="redis://127.0.0.1:1/0",  # nothing listens there
        conventions_workloads={},
    )
    found = {(f.code, f.subject) for f in static_checks(app)}
    assert ("redis-config-unreadable", "redis 127.0.0.1:1") in found
    # the broker's server answered: no unreadable finding about it
    assert not any(code == "redis-config-unreadable" and "127.0.0.1:1" not in subject
                   for code, subject in found)  # fmt: skip


@pytest.fixture
def spare() -> Iterator[SpareRedis]:
    """A Redis of the test's own: no AOF, no RDB snapshots."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server (the test starts one of its own)", FileNotFoundError())
    server = SpareRedis()
    server.start()
    yield server
    server.stop()


def _app(port: int, **conf: Any) -> App:
    app = App("doctor_spare", set_as_current=False)
    defaults = {
        "broker_url": f"redis://127.0.0.1:{port}/0",
        "broker_transport": "conventions.transport.redis:Transport",
        "conventions_store_url": f"redis://127.0.0.1:{port}/1",
        "conventions_workloads": {},
        "conventions_doctor_levels": {},
    }
    app.conf.update({**defaults, **conf})
    return app


def _levels(app: App, code: str) -> list[str]:
    return [f.level for f in static_checks(app) if f.code == code]


def test_a_redis_without_persistence_refuses_to_start_a_worker_by_default(
    spare: SpareRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    app = _app(spare.port)
    assert _levels(app, "redis-no-persistence") == [ERROR]
    with pytest.raises(SystemExit) as refused:
        lifecycle.on_worker_init(sender=SimpleNamespace(app=app))
    assert refused.value.code == lifecycle.EX_CONFIG
    assert "redis-no-persistence" in capsys.readouterr().err


def test_the_level_setting_lowers_the_persistence_check_and_snapshots_silence_it(
    spare: SpareRedis,
) -> None:
    lowered = _app(spare.port, conventions_doctor_levels={"redis-no-persistence": "warning"})
    assert _levels(lowered, "redis-no-persistence") == [WARNING]
    lifecycle.on_worker_init(sender=SimpleNamespace(app=lowered))  # starts: a warning only
    client = redis.Redis(port=spare.port)
    client.config_set("save", "3600 1")  # RDB snapshots on (none is due during the test)
    try:
        assert _levels(_app(spare.port), "redis-no-persistence") == []
    finally:
        client.config_set("save", "")  # no snapshot when the server stops
        client.close()


def test_an_audit_trail_that_may_fill_the_brokers_redis_is_a_warning(spare: SpareRedis) -> None:
    client = redis.Redis(port=spare.port)
    client.config_set("maxmemory", str(512 * 2**20))
    client.close()
    shared = _app(spare.port)
    [finding] = [f for f in static_checks(shared) if f.code == "audit-fills-broker"]
    assert finding.level == WARNING
    assert "900 MB" in finding.message
    assert "conventions_audit_max_trails" in finding.message
    assert (
        _levels(_app(spare.port, conventions_audit_max_trails=100_000), "audit-fills-broker") == []
    )
    elsewhere = _app(spare.port, conventions_store_url="postgresql://db/app")
    assert _levels(elsewhere, "audit-fills-broker") == []
