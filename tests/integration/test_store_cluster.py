"""The Redis store on Redis Cluster, beyond the contract suite (which runs on it too):
one job's keys in one slot, no result write riding a script on another server, writes
that wait for a replica, and what the doctor says of the cluster. Against the session's
three-master cluster (``redis_cluster`` in ``tests/fixtures.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from conventions import App
from conventions.config import cluster
from conventions.errors import BackendUnavailable
from conventions.ops.doctor import static_checks
from conventions.results import redis as results
from conventions.store import RedisStore, keys, open_store
from conventions.store.records import AuditEvent
from tests.integration import support_cluster


@pytest.fixture
def store(redis_cluster: support_cluster.Cluster) -> Iterator[RedisStore]:
    made = open_store(support_cluster.url(redis_cluster.ports), prefix=f"cc-{uuid.uuid4().hex}:")
    assert isinstance(made, RedisStore)
    yield made
    for key in made.client.scan_iter(match=keys.pattern(made.prefix), count=1000):
        made.client.delete(key)
    made.close()


def _event(name: str, job: str, correlation: str, run: dict[str, Any]) -> AuditEvent:
    return AuditEvent(
        event=name, task="billing.charge.v1", task_id=job, correlation_id=correlation,
        idempotency_key="charge:1",
    ).with_run({"id": job, **run})  # fmt: skip


def test_every_key_of_one_job_hashes_to_one_slot(store: RedisStore) -> None:
    key, job, correlation = "billing.charge:charge:1", "job-1", f"corr-{uuid.uuid4().hex}"
    run = {"set": {"task": "billing.charge.v1"}, "once": {}, "order": [0, 0]}
    store.reserve(key, job, 60, audit=_event("published", job, correlation, run))
    store.claim(key, "worker-1", 60, "delivery-1", audit=_event("started", job, correlation, run))
    store.complete(
        key, "worker-1", "ok", 60, job, audit=_event("succeeded", job, correlation, run),
        delivery_id="delivery-1",
    )  # fmt: skip
    store.add_audit(_event("replayed", job, correlation, run))
    found = list(store.client.scan_iter(match=keys.pattern(store.prefix), count=1000))
    # the done entry's day bucket, the run record, the trail, and the indexes and
    # counters of its partition; the completion dropped the reservation, the running
    # lease and the delivery counter
    kinds = {name.split(":", 2)[2] for name in found}
    assert kinds >= {f"run:rec:{job}", f"audit:log:{correlation}", "audit:by-time", "counts"}
    assert "run:all" in kinds and any(kind.startswith("done:") for kind in kinds)
    assert not any(kind.startswith(("ledger:", "deliveries:")) for kind in kinds)
    assert store.key_state(key).ledger_state == "done"
    assert len({redis.RedisCluster.keyslot(store.client, name) for name in found}) == 1
    assert [e.event for e in store.audit_for(correlation)] == [
        "published", "started", "succeeded", "replayed",
    ]  # fmt: skip


def test_jobs_spread_over_every_master(store: RedisStore, redis_cluster: Any) -> None:
    for i in range(60):
        store.reserve(f"order:{i}", f"job-{i}", 60)
    holding = {}
    for port in redis_cluster.ports:
        with redis.Redis(port=port) as node:
            holding[port] = sum(1 for _ in node.scan_iter(match=keys.pattern(store.prefix)))
    assert all(count > 0 for count in holding.values()), holding
    assert sum(holding.values()) == 60  # one key per reservation (no fingerprint given)


def test_a_cluster_call_tries_three_times_within_about_its_timeout(
    redis_cluster: support_cluster.Cluster,
) -> None:
    """A silent master holds a call about ``socket_timeout`` in all, not redis-py's ten
    tries of the whole timeout each."""
    client = cluster.client_from_url(support_cluster.url(redis_cluster.ports), socket_timeout=6)
    try:
        assert client.retry.get_retries() + 1 == cluster.TRIES == 3
        kwargs = client.nodes_manager.connection_kwargs
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 2
    finally:
        client.close()


def test_a_cluster_url_with_a_database_number_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="no database number"):
        open_store("redis+cluster://127.0.0.1:7100,127.0.0.1:7101/3")


def test_no_result_write_rides_a_cluster_stores_scripts(store: RedisStore) -> None:
    """The result backend is never the store's server on a cluster: Celery's own
    writes go out, nothing rides (and nothing SELECTs on a cluster)."""
    host, port = store.server()
    backend = results.RedisBackend(app=Celery("cluster_results"), url=f"redis://{host}:{port}/0")
    assert backend.store_alongside(store) is None
    assert not store.shares_server(host, port)


def test_a_write_no_replica_confirmed_raises_backend_unavailable(
    redis_cluster: support_cluster.Cluster,
) -> None:
    """Acknowledged means kept: on masters without replicas, ``min_replicas=1`` refuses."""
    url = support_cluster.url(redis_cluster.ports, "min_replicas=1&replica_wait_ms=50")
    guarded = open_store(url, prefix=f"cc-{uuid.uuid4().hex}:")
    try:
        with pytest.raises(BackendUnavailable, match="0 of 1 replica"):
            guarded.claim("order:1", "worker-1", 30, "delivery-1")
        assert guarded.key_state("order:1").ledger_state == "running"  # reads go out as is
    finally:
        guarded.close()


def _doctor(url: str) -> set[str]:
    app = App("doctor_cluster", set_as_current=False)
    app.conf.update(
        broker_url="memory://", conventions_store_url=url, conventions_workloads={},
        conventions_doctor_levels={},
    )  # fmt: skip
    return {f.code for f in static_checks(app)}


def test_the_doctor_names_a_cluster_without_replicas_and_unreplicated_writes(
    redis_cluster: support_cluster.Cluster,
) -> None:
    found = _doctor(support_cluster.url(redis_cluster.ports))
    assert {"cluster-master-without-replica", "cluster-store-not-replicated"} <= found
    assert "cluster-partial-coverage" not in found


def test_the_doctor_names_a_cluster_that_answers_with_slots_missing(
    redis_cluster: support_cluster.Cluster,
) -> None:
    node = redis.Redis(port=redis_cluster.ports[1])
    node.config_set("cluster-require-full-coverage", "no")
    try:
        assert "cluster-partial-coverage" in _doctor(support_cluster.url(redis_cluster.ports))
    finally:
        node.config_set("cluster-require-full-coverage", "yes")
        node.close()


def test_the_doctor_names_a_cluster_master_that_evicts_keys(
    redis_cluster: support_cluster.Cluster,
) -> None:
    node = redis.Redis(port=redis_cluster.ports[2])
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        app = App("doctor_cluster_eviction", set_as_current=False)
        app.conf.update(
            broker_url="memory://", conventions_workloads={}, conventions_doctor_levels={},
            conventions_store_url=support_cluster.url(redis_cluster.ports),
        )  # fmt: skip
        found = {(f.code, f.subject) for f in static_checks(app)}
        assert ("redis-eviction", f"redis cluster 127.0.0.1:{redis_cluster.ports[2]}") in found
        assert not any(code == "redis-no-persistence" for code, _ in found)  # AOF is on
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.close()


def test_state_documents_on_several_slots_are_read_together(store: RedisStore) -> None:
    """The pause watch's read of its queues' documents (one ``MGET`` per hash slot)."""
    names = [f"queue:paused:q{n}" for n in range(12)]
    for name in names[::2]:
        store.put_state(name, {"name": name}, None)
    slots = {store.client.keyslot(store._state(name)) for name in names}
    assert len(slots) > 1  # the documents spread over the cluster
    found = store.get_states(names)
    assert found == {name: {"name": name} for name in names[::2]}
