"""The doctor asks each Redis server that keeps jobs for its settings: the broker's, and
a store on another server."""

from __future__ import annotations

from conventions import App
from conventions.doctor import static_checks
from tests.conftest import BROKER_DB, REDIS_BASE


def test_a_store_on_another_redis_server_is_asked_for_its_settings_too(services: None) -> None:
    app = App("doctor_servers", set_as_current=False)
    app.conf.update(
        broker_url=f"{REDIS_BASE}/{BROKER_DB}",
        broker_transport="conventions.broker:Transport",
        conventions_store_url="redis://127.0.0.1:1/0",  # nothing listens there
        conventions_workloads={},
    )
    found = {(f.code, f.subject) for f in static_checks(app)}
    assert ("redis-config-unreadable", "redis 127.0.0.1:1") in found
    # the broker's server answered: no unreadable finding about it
    assert not any(code == "redis-config-unreadable" and "127.0.0.1:1" not in subject
                   for code, subject in found)  # fmt: skip
