"""Redis Sentinel without a server: URLs, the transport's choice of channel, the
keeper's hold after a failover, the one-trip eligibility and the doctor's findings
(the group itself runs in tests/integration/test_sentinel.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection

from conventions.config import sentinel
from conventions.config.profile import INBOX_TRANSPORT, reliable
from conventions.errors import BackendUnavailable, ConfigurationError
from conventions.ops import doctor_sentinel
from conventions.ops.findings import ERROR, WARNING
from conventions.store.redis import RedisStore
from conventions.transport import publish as onetrip
from conventions.transport.redis import Channel, SentinelChannel, Transport
from conventions.transport.sentinel import FollowingKeeper, wanted

SENTINELS = "sentinel://10.0.0.1:26379/2;sentinel://10.0.0.2:26380/2"
STORE = "redis://127.0.0.1:6379/15"


def test_a_sentinel_url_names_its_sentinels_database_and_options() -> None:
    parsed = sentinel.parse(
        "sentinel://:s3cret@10.0.0.1:26379;sentinel://10.0.0.2/4?master_name=main&min_replicas=1"
    )
    assert parsed.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379))
    assert (parsed.db, parsed.password, parsed.master_name) == (4, "s3cret", "main")
    assert sentinel.replicas_wanted(parsed.options) == (1, sentinel.REPLICA_WAIT_MS)
    with pytest.raises(ValueError, match="not a Sentinel URL"):
        sentinel.parse("sentinel://a:1;redis://b:2")
    with pytest.raises(ValueError, match="min_replicas"):
        sentinel.replicas_wanted({"min_replicas": -1})


def test_a_store_url_takes_the_layers_options_out_of_redis_pys() -> None:
    client: Any = sentinel.client_from_url(
        f"{STORE}?min_replicas=2&replica_wait_ms=250&health_check_interval=5", socket_timeout=1
    )
    try:
        assert (client.min_replicas, client.replica_wait_ms) == (2, 250)
        kwargs = client.connection_pool.connection_kwargs
        assert "min_replicas" not in kwargs and kwargs["health_check_interval"] == 5
    finally:
        client.close()
    with pytest.raises(ValueError, match="master_name"):
        sentinel.client_from_url(SENTINELS, socket_timeout=1)


def test_a_broker_reader_gets_a_client_of_the_groups_primary() -> None:
    client = sentinel.broker_client(SENTINELS, {"master_name": "main"}, socket_timeout=1)
    try:
        assert sentinel.group_of(client) == (
            "main",
            frozenset({("10.0.0.1", 26379), ("10.0.0.2", 26380)}),
        )
        assert client.connection_pool.connection_kwargs["db"] == 2
    finally:
        client.close()
    with pytest.raises(ValueError, match="master_name"):
        sentinel.broker_client(SENTINELS)
    plain = sentinel.broker_client(STORE)
    assert sentinel.group_of(plain) is None
    plain.close()


def test_too_few_replicas_is_backend_unavailable_in_one_line() -> None:
    with pytest.raises(BackendUnavailable) as caught:
        sentinel.check_replicated(0, 1, 500, "broker")
    assert caught.value.backend == "broker"
    assert "\n" not in str(caught.value) and "0 of 1 replica" in str(caught.value)
    sentinel.check_replicated(2, 1, 500, "broker")  # enough: nothing raised


def test_the_layers_transport_makes_sentinel_channels_on_a_sentinel_connection() -> None:
    connection = Connection(SENTINELS, transport=INBOX_TRANSPORT,
                            transport_options={"master_name": "main"})  # fmt: skip
    transport = connection.transport
    assert isinstance(transport, Transport) and transport.Channel is SentinelChannel
    assert connection.cycle is None  # never switched to kombu's stock transport
    assert wanted(connection)
    plain = Connection("redis://127.0.0.1:6379/0", transport=INBOX_TRANSPORT)
    assert plain.transport.Channel is Channel and not wanted(plain)
    options = SentinelChannel.from_transport_options
    assert {"master_name", "min_replicas", "replica_wait_ms", "recovery_timeout"} <= set(options)
    assert SentinelChannel.Keeper is FollowingKeeper


def test_a_keeper_holds_its_sweeps_one_period_after_its_primary_changed() -> None:
    keeper = FollowingKeeper(
        "c1", client=lambda: None, queues=list, inboxes=dict, restore=lambda: None,
        unacked_index="unacked_index", recovery_timeout=30.0, mover_interval=1.0,
    )  # fmt: skip
    keeper.follow("run-a")
    assert keeper.quiet_until == 0.0  # the first primary: no change
    keeper.follow("run-b")
    assert keeper.failovers == 1 and keeper.quiet_until > 0
    assert keeper.sweep() == 0  # held: the client (None here) is not even asked


def test_a_sentinel_broker_publishes_in_one_trip_only_with_a_store_of_its_group() -> None:
    from celery import Celery

    app = Celery("unit-sentinel")
    app.conf.update(broker_url=SENTINELS, broker_transport=INBOX_TRANSPORT,
                    broker_transport_options={"master_name": "main"})  # fmt: skip
    same = RedisStore(f"{SENTINELS}?master_name=main")
    other = RedisStore(f"{SENTINELS}?master_name=other")
    plain = RedisStore(STORE)
    try:
        assert onetrip._same_server(app.conf, same)
        assert not onetrip._same_server(app.conf, other)
        assert not onetrip._same_server(app.conf, plain)
        assert sentinel.same_primary(same.client, plain.client) is False
        assert sentinel.same_primary(plain.client, plain.client) is None
    finally:
        for store in (same, other, plain):
            store.close()
        app.close()


def test_reliable_needs_the_groups_name_in_one_line() -> None:
    with pytest.raises(ConfigurationError) as caught:
        reliable(broker_url=SENTINELS, store_url=STORE)
    message = str(caught.value)
    assert "\n" not in message
    assert "sentinel://" in message and "master_name" in message


def test_reliable_gives_a_sentinel_broker_the_layers_transport_and_the_redis_promises() -> None:
    conf = reliable(
        broker_url=SENTINELS, store_url=STORE,
        broker_transport_options={"master_name": "ccmaster", "min_replicas": 1},
    )  # fmt: skip
    assert conf["broker_transport"] == INBOX_TRANSPORT
    options = conf["broker_transport_options"]
    assert (options["master_name"], options["min_replicas"]) == ("ccmaster", 1)
    assert options["recovery_timeout"] == 30.0 and options["socket_timeout"] == 5.0
    assert conf["result_backend"] == f"conventions.results.redis:SentinelBackend+{SENTINELS}"
    assert conf["result_backend_transport_options"]["master_name"] == "ccmaster"
    assert conf["result_backend_always_retry"] is True
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"] is False
    found = _found(conf)  # the doctor: only what the store's plain URL misses
    assert found == set(), found
    # the Sentinel channel keeps the delayed sets: any countdown, no visibility cap
    from conventions.config import settings

    assert settings.delayed_delivery(conf)
    assert settings.max_countdown(conf) == settings.DELAYED_SET_MAX_COUNTDOWN


def _found(conf: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(f.level, f.code, f.subject) for f in doctor_sentinel.findings(conf)}


def test_the_doctor_says_what_a_sentinel_setup_misses_and_what_a_failover_loses() -> None:
    assert _found({"broker_url": STORE, "conventions_store_url": STORE}) == set()
    bare = _found({"broker_url": SENTINELS, "broker_transport": INBOX_TRANSPORT})
    assert bare == {
        (ERROR, "sentinel-master-name-missing", "broker_transport_options"),
        (WARNING, "sentinel-publish-not-replicated", "broker_transport_options"),
    }
    assert _found({"broker_url": SENTINELS, "broker_transport_options": {"master_name": "m"}}) == {
        (WARNING, "sentinel-stock-transport", "broker_transport")
    }
    kept = {
        "broker_url": SENTINELS, "broker_transport": INBOX_TRANSPORT,
        "broker_transport_options": {"master_name": "m", "min_replicas": 1},
        "result_backend": f"conventions.results.redis:SentinelBackend+{SENTINELS}",
        "result_backend_transport_options": {"master_name": "m"},
        "conventions_store_url": f"{SENTINELS}?master_name=m&min_replicas=1",
    }  # fmt: skip
    assert _found(kept) == set()
    loose = {**kept, "conventions_store_url": SENTINELS, "result_backend_transport_options": {}}
    assert _found(loose) == {
        (ERROR, "sentinel-master-name-missing", "result_backend_transport_options"),
        (ERROR, "sentinel-master-name-missing", "conventions_store_url"),
        (WARNING, "sentinel-store-not-replicated", "conventions_store_url"),
    }
    message = next(f.message for f in doctor_sentinel.findings(loose)
                   if f.code == "sentinel-store-not-replicated")  # fmt: skip
    assert "twice" in message and "\n" not in message
