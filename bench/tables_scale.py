"""The at-scale page's tables of the cluster runs: the store on Redis Cluster per shard
(:mod:`bench.scale_cluster`), RabbitMQ on one node and three (:mod:`bench.scale_rabbit`)
and an idle fleet (:mod:`bench.fleet`), made from their result files as
:mod:`bench.tables` makes the others."""

from __future__ import annotations

from typing import Any

from bench.tables import PLANNED, caption

#: what each store configuration of ``bench.scale_cluster`` is, in a table
STORES = {
    "store": "one Redis (no cluster)",
    "cluster1": "Redis Cluster, 1 master",
    "cluster3": "Redis Cluster, 3 masters",
}
#: the goal of three masters against one (issue #33)
GOAL_THREE = 2.5


def cluster_shards(data: dict[str, Any]) -> list[str]:
    """Per configuration and master: its partitions and keys, its CPU and commands per
    job of the whole run (publish, run), its CPU while idle."""
    lines = [
        caption(data), "",
        "| store | master | partitions (of 64) | keys after the run | CPU per job: publish "
        "| run | commands per job: publish | run | idle CPU (µs/s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, conf in data["configs"].items():
        publish, run = conf["phases"]
        for i, port in enumerate(conf["ports"]):
            lines.append(
                f"| {STORES.get(name, name)} | {i + 1} (:{port}) | {conf['partitions'][i]} "
                f"| {conf['keys'][i]:,} | {publish['shard_cpu_us'][i]:,.0f} µs "
                f"| {run['shard_cpu_us'][i]:,.0f} µs | {publish['shard_commands'][i]:.1f} "
                f"| {run['shard_commands'][i]:.1f} | {conf['idle_cpu_us_per_s'][i]:,.0f} |"
            )
    return lines


def cluster_capacity(data: dict[str, Any]) -> list[str]:
    """Per configuration: the store's CPU per job (every shard's), the busiest shard's,
    the jobs/s that holds at :data:`PLANNED` of a core per shard, against one master."""
    base = data["configs"]["cluster1"]["capacity_jobs_s"]
    lines = [
        caption(data), "",
        "| store | store CPU per job, all shards | busiest shard per job "
        "| without its idle CPU (per round) "
        f"| jobs/s at {PLANNED:.0%} of a core per shard (computed) | against 1 master "
        "| measured jobs/s (the worker's, `-c 2`) |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]  # fmt: skip
    for name, conf in data["configs"].items():
        total = sum(sum(p["shard_cpu_us"]) for p in conf["phases"])
        rounds = ", ".join(f"{x:,.0f}" for x in conf["busiest_net_cpu_us_rounds"])
        ratio = conf["capacity_jobs_s"] / base if base else float("nan")
        goal = ""
        if name == "cluster3":
            goal = f" (goal >= {GOAL_THREE}: {'met' if ratio >= GOAL_THREE else '**missed**'})"
        lines.append(
            f"| {STORES.get(name, name)} | {total:,.0f} µs | {conf['busiest_cpu_us']:,.0f} µs "
            f"| {conf['busiest_net_cpu_us']:,.0f} µs ({rounds}) | about {conf['capacity_jobs_s']:,} | {ratio:.2f}x{goal} "
            f"| {conf['phases'][1]['jobs_per_s']:,.0f} |"
        )
    return lines


def cluster_text(data: dict[str, Any]) -> list[str]:
    """What ``python -m bench.scale_cluster`` prints."""
    return [*cluster_shards(data), "", *cluster_capacity(data)[2:]]
