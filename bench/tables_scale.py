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
    """Per configuration: the store's CPU per job (every shard's) and the busiest
    shard's (sums of the phases' medians), the busiest shard's without its idle CPU (the
    median of its rounds: what the capacity is computed from), the jobs/s that holds at
    :data:`PLANNED` of a core per shard, against one master."""
    base = data["configs"]["cluster1"]["capacity_jobs_s"]
    lines = [
        caption(data), "",
        "| store | store CPU per job, all shards | busiest shard per job "
        "| without its idle CPU (per round) "
        f"| jobs/s at {PLANNED:.0%} of a core per shard (computed) | against 1 master "
        "| measured jobs/s (the worker's, `-c 2`) | the broker's CPU per job (one Redis) |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, conf in data["configs"].items():
        total = sum(sum(p["shard_cpu_us"]) for p in conf["phases"])
        shards = range(len(conf["ports"]))
        busiest = max(sum(p["shard_cpu_us"][i] for p in conf["phases"]) for i in shards)
        rounds = ", ".join(f"{x:,.0f}" for x in conf["busiest_net_cpu_us_rounds"])
        ratio = conf["capacity_jobs_s"] / base if base else float("nan")
        goal = ""
        if name == "cluster3":
            goal = f" (goal >= {GOAL_THREE}: {'met' if ratio >= GOAL_THREE else '**missed**'})"
        lines.append(
            f"| {STORES.get(name, name)} | {total:,.0f} µs | {busiest:,.0f} µs "
            f"| {conf['busiest_net_cpu_us']:,.0f} µs ({rounds}) "
            f"| about {conf['capacity_jobs_s']:,} | {ratio:.2f}x{goal} "
            f"| {conf['phases'][1]['jobs_per_s']:,.0f} "
            f"| {sum(p['broker_cpu_us'] for p in conf['phases']):,.0f} µs |"
        )
    return lines


def cluster_instructions(data: dict[str, Any]) -> list[str]:
    """Per cluster and master, counted by callgrind: its instructions per job of the whole
    run (idle and the bench's reads taken out), its idle rate, and three masters against one
    computed from the busiest shards."""
    block = data["instructions"]
    base = max(block["configs"]["cluster1"]["per_job"])
    lines = [
        caption(block).removesuffix("._") + "; instruction counts do not depend on the load._",
        "",
        "| store | master | partitions (of 64) | instructions per job (net) "
        "| commands per job | instructions per command | idle (per s) "
        "| per read of the counters | jobs/s against 1 master (busiest shard, computed) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    sums = []
    for name, conf in block["configs"].items():
        busiest = max(conf["per_job"])
        for i, port in enumerate(conf["ports"]):
            against = ""
            if conf["per_job"][i] == busiest:
                ratio = base / busiest
                goal = ""
                if name == "cluster3":
                    met = "met" if ratio >= GOAL_THREE else "**missed**"
                    goal = f" (goal >= {GOAL_THREE}: {met})"
                against = f"{ratio:.2f}x{goal}"
            commands = conf["commands_per_job"][i]
            lines.append(
                f"| {STORES.get(name, name)} | {i + 1} (:{port}) | {conf['partitions'][i]} "
                f"| {conf['per_job'][i]:,} | {commands:.1f} "
                f"| {conf['per_job'][i] / commands:,.0f} | {conf['idle_per_s'][i]:,} "
                f"| {conf['per_poll'][i]:,} | {against} |"
            )
        sums.append(f"{STORES.get(name, name)} {sum(conf['per_job']):,}")
    return [*lines, "", f"_Instructions per job, all masters summed: {'; '.join(sums)}._"]


def cluster_text(data: dict[str, Any]) -> list[str]:
    """What ``python -m bench.scale_cluster`` prints."""
    return [*cluster_shards(data), "", *cluster_capacity(data)[2:]]


def rabbit_replication(data: dict[str, Any]) -> list[str]:
    """RabbitMQ's CPU per job on one node and on three (every VM's, summed), by variant
    and phase, and three nodes against one."""
    by = {(r["nodes"], r["variant"]): r for r in data["rows"]}
    idle = data["idle_cpu_us_per_s"]
    lines = [
        caption(data), "",
        "| variant | phase | RabbitMQ CPU per job, one node | three nodes (summed) | ratio "
        "| per round: one node | three nodes |",
        "|---|---|---:|---:|---:|---|---|",
    ]  # fmt: skip
    for variant in dict.fromkeys(r["variant"] for r in data["rows"]):
        one, three = by.get((1, variant)), by.get((3, variant))
        if one is None or three is None:
            continue
        whole = [0.0, 0.0]
        for a, b in zip(one["phases"], three["phases"], strict=True):
            whole[0] += a["rabbitmq_cpu_us"]
            whole[1] += b["rabbitmq_cpu_us"]
            lines.append(
                f"| `{variant}` | {a['phase']} | {a['rabbitmq_cpu_us']:,.0f} µs "
                f"| {b['rabbitmq_cpu_us']:,.0f} µs "
                f"| {b['rabbitmq_cpu_us'] / a['rabbitmq_cpu_us']:.1f}x "
                f"| {', '.join(f'{x:,.0f}' for x in a['rabbitmq_cpu_rounds'])} "
                f"| {', '.join(f'{x:,.0f}' for x in b['rabbitmq_cpu_rounds'])} |"
            )
        lines.append(f"| `{variant}` | **whole job** | **{whole[0]:,.0f} µs** "
                     f"| **{whole[1]:,.0f} µs** "
                     f"| **{whole[1] / whole[0]:.1f}x** | | |")  # fmt: skip
    lines += ["", f"_Idle VMs, taken out above: one node {idle['1']:,.0f} µs/s, three nodes "
              f"{idle['3']:,.0f} µs/s (summed)._"]  # fmt: skip
    return lines


#: the issue's bound on an idle worker's commands per second (#33)
IDLE_GOAL = 2.0


def fleet_idle(data: dict[str, Any]) -> list[str]:
    """An idle fleet: commands per second in all and per consumer (the busiest commands),
    Redis CPU, connections."""
    lines = [
        caption(data), "",
        "| fleet | queues each | commands/s | per consumer | the busiest (per s, in all) "
        "| Redis CPU | connections |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]  # fmt: skip
    for run in data["runs"]:
        what = "simulated (threads)" if run["fleet"] == "simulated" else "real solo workers"
        top = ", ".join(f"`{k}` {v:,.1f}" for k, v in list(run["by_command_per_s"].items())[:4])
        per = run["commands_per_s_per_consumer"]
        goal = f" ({'met' if per <= IDLE_GOAL else '**over**'} <= {IDLE_GOAL:g})"
        lines.append(
            f"| {run['consumers']} {what} | {run['queues']} | {run['commands_per_s']:,.0f} "
            f"| {per:.2f}{goal} | {top} | {run['redis_cpu_us_per_s'] / 1e4:.1f}% of a core "
            f"| {run['connections']:,} |"
        )
    return lines


def fleet_sweep(data: dict[str, Any]) -> list[str]:
    """One sweep (nobody dead) by the consumers registered, and the fleet's sweeps."""
    period = data["recovery_timeout"] / 3
    lines = [
        caption(data), "",
        "| consumers registered | commands per sweep | Redis CPU per sweep "
        f"| the fleet's sweeps/s (one per consumer every {period:g} s) | their Redis CPU |",
        "|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for s in data["sweeps"]:
        lines.append(
            f"| {s['consumers']} | {s['commands']:g} | {s['redis_cpu_us']:,.0f} µs "
            f"| {s['fleet_sweeps_per_s']:g} | {s['fleet_cpu_us_per_s'] / 1e4:.2f}% of a core |"
        )
    return lines


#: the configurations of ``bench.store_instructions``, as a table names them
STORE_CONFIGS = {
    "full": "as profiled (audit events and run history)",
    "no_runs": "run history off (`conventions_runs_enabled = False`)",
    "neither": "no audit event, no run history",
}


def store_instructions(data: dict[str, Any]) -> list[str]:
    """Per configuration of the Redis store's scripts, per job: instructions (callgrind)
    and commands run inside the scripts, by step, and each against the full one."""
    configs = data["configs"]
    full = sum(step["instructions"] for step in configs["full"].values())
    lines = [
        caption(data).removesuffix("._") + f", {data['jobs']} jobs; instruction counts "
        "do not depend on the load._",
        "",
        "| store scripts | publish | claim | complete | per job | against the full profile "
        "| commands in scripts per job (publish + claim + complete) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for name, steps in configs.items():
        total = sum(step["instructions"] for step in steps.values())
        commands = " + ".join(f"{step['commands']:g}" for step in steps.values())
        lines.append(
            f"| {STORE_CONFIGS.get(name, name)} | {steps['publish']['instructions']:,.0f} "
            f"| {steps['claim']['instructions']:,.0f} | {steps['complete']['instructions']:,.0f} "
            f"| {total:,.0f} | {total / full:.2f}x "
            f"| {commands} = {sum(step['commands'] for step in steps.values()):g} |"
        )
    return lines


#: the tables of this module a docs marker may name (:mod:`bench.docs` adds them)
TABLES = {
    "scale-cluster-shards": cluster_shards,
    "scale-cluster-capacity": cluster_capacity,
    "scale-cluster-instructions": cluster_instructions,
    "scale-rabbit-replication": rabbit_replication,
    "fleet-idle": fleet_idle,
    "fleet-sweep": fleet_sweep,
    "store-instructions": store_instructions,
}
