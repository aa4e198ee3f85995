"""The store's key naming on Redis Cluster, and its URL: one job's keys under one hash
tag, the tags spread evenly over the slots, and on one Redis the names as they were."""

from __future__ import annotations

import pytest

from conventions.config import cluster
from conventions.store import keys, resolve_url


def test_on_one_redis_a_jobs_keys_keep_their_names() -> None:
    prefix = keys.scope("cc:", "payments.apply_event:evt_1", clustered=False)
    assert (
        keys.ledger("payments.apply_event:evt_1", prefix) == "cc:ledger:payments.apply_event:evt_1"
    )
    assert keys.scopes("cc:", clustered=False) == ["cc:"]


def test_on_a_cluster_a_jobs_keys_share_one_hash_tag() -> None:
    key = "payments.apply_event:evt_1"
    prefix = keys.scope("cc:", key, clustered=True)
    names = [
        keys.ledger(key, prefix), keys.dedup(key, prefix), keys.deliveries("d-1", prefix),
        keys.audit("corr-1", prefix), keys.counts(prefix), f"{prefix}run:rec:task-1",
    ]  # fmt: skip
    assert {name[: name.index("}") + 1] for name in names} == {prefix[:-1]}
    assert prefix in keys.scopes("cc:", clustered=True)


def test_the_partition_tags_are_one_in_each_sixty_fourth_of_the_slots() -> None:
    slots = [keys.crc16(tag.encode()) % 16384 for tag in keys.PARTITION_TAGS]
    assert [slot * keys.CLUSTER_PARTITIONS // 16384 for slot in slots] == list(
        range(keys.CLUSTER_PARTITIONS)
    )


def test_the_slots_of_one_concurrency_limit_share_a_partition() -> None:
    assert {keys.lease_source(f"limit:smtp:{n}") for n in range(8)} == {"limit:smtp"}


def test_a_cluster_url_names_its_nodes_and_the_layers_options() -> None:
    nodes, options, ours = cluster.parse(
        "rediss+cluster://:s3cret@10.0.0.1:7000,10.0.0.2/?min_replicas=1&socket_timeout=2"
    )
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 6379)]
    assert options == {"ssl": True, "username": None, "password": "s3cret", "socket_timeout": 2.0}
    assert ours == {"min_replicas": "1"}
    assert resolve_url("redis+cluster://10.0.0.1:7000/")[0] == "redis"


@pytest.mark.parametrize("url", ["redis+cluster://10.0.0.1:7000/3", "redis+cluster:///"])
def test_a_cluster_url_with_a_database_or_without_a_node_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="redis\\+cluster://"):
        resolve_url(url)
