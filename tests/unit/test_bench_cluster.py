"""The cluster runs' arithmetic (``bench.scale_cluster``, ``bench.fleet``): slot ranges,
the partitions' spread, the idle CPU taken out, the capacity against one master (no
server, no worker)."""

from __future__ import annotations

import itertools

from bench import cluster_instructions, fleet, redis_cluster, scale_cluster, tables_scale


def test_the_masters_hold_equal_contiguous_slot_ranges() -> None:
    for masters in (1, 3, 5):
        found = redis_cluster.ranges(masters)
        assert found[0][0] == 0 and found[-1][1] == redis_cluster.SLOTS - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(found))
        sizes = [last - first + 1 for first, last in found]
        assert max(sizes) - min(sizes) <= 1


def test_three_masters_hold_a_third_of_the_64_partitions_each() -> None:
    assert scale_cluster.partitions([7200]) == [64]
    assert sorted(scale_cluster.partitions([7200, 7201, 7202])) == [21, 21, 22]


def _run(cpu: list[tuple[float, float]], idle: list[float], seconds: float = 10.0) -> dict:
    return {
        "jobs": 1000,
        "idle_cpu_us_per_s": idle,
        "keys": [0] * len(idle),
        "phases": [
            {"phase": phase, "seconds": seconds, "jobs_per_s": 100.0, "broker_cpu_us": 50.0,
             "shard_cpu_us": [c[n] for c in cpu], "shard_commands": [1.0] * len(cpu)}
            for n, phase in enumerate(("publish", "run"))
        ],
    }  # fmt: skip


def test_a_shards_idle_cpu_is_taken_out_and_the_busiest_shard_sets_the_capacity() -> None:
    # 1,000 jobs in 2 x 10 s; idle 1,000 µs/s is 10 µs per job per phase
    one = scale_cluster._median_runs([_run([(210.0, 710.0)], [1000.0])], [7210])
    assert one["busiest_net_cpu_us"] == 900.0 and one["capacity_jobs_s"] == 778
    three = scale_cluster._median_runs(
        [_run([(80.0, 250.0), (90.0, 270.0), (70.0, 240.0)], [1000.0] * 3)], [1, 2, 3]
    )
    assert three["busiest_net_cpu_us"] == 340.0  # the second shard: 90 + 270 - 2 x 10
    data = {
        "command": "python -m bench.scale_cluster", "commit": "0123456789abcdef",
        "date": "2026-12-02T05:00:00Z", "cores": 2,
        "load": {"start": [1.0, 1.0, 1.0], "end": [1.0, 1.0, 1.0], "quiet": True},
        "configs": {"cluster1": one, "cluster3": three},
    }  # fmt: skip
    (row,) = [line for line in tables_scale.cluster_capacity(data) if "3 masters" in line]
    assert "2.65x (goal >= 2.5: met)" in row


def test_a_fleet_is_shared_out_over_its_processes() -> None:
    assert fleet._share(100, 4) == [25, 25, 25, 25]
    assert fleet._share(10, 3) == [4, 3, 3]


def test_a_masters_instructions_per_job_leave_out_its_idle_rate_and_the_benchs_reads() -> None:
    # 3,000,000 counted over 10 s: 100,000/s idle is 1,000,000, 20 reads of 50,000 another
    # 1,000,000; 1,000,000 left over 100 jobs
    found = cluster_instructions.per_job(
        3_000_000, idle_per_s=100_000.0, seconds=10.0, polls=20, poll=50_000.0, jobs=100
    )
    assert found == 10_000.0


def test_three_masters_against_one_are_set_by_the_busiest_shard() -> None:
    assert cluster_instructions.ratio([30_000.0], [9_000.0, 12_000.0, 10_000.0]) == 2.5


def test_the_instruction_count_is_read_from_a_callgrind_files_summary() -> None:
    text = (
        "version: 1\ncmd: redis-server\nevents: Ir\nsummary: 2383794\n\nfn=main\ntotals: 2414796\n"
    )
    assert cluster_instructions.summary(text) == 2_383_794


def test_the_instruction_table_names_the_busiest_shard_against_the_goal() -> None:
    def conf(ports: list[int], per_job: list[int]) -> dict:
        n = len(ports)
        return {"ports": ports, "partitions": [64 // n] * n, "per_job": per_job,
                "idle_per_s": [1] * n, "per_poll": [1] * n,
                "commands_per_job": [10.0] * n}  # fmt: skip

    block = {
        "command": "python -m bench.scale_cluster --instructions", "commit": "0123456789abcdef",
        "date": "2026-12-02T05:00:00Z", "cores": 2,
        "load": {"start": [9.0, 9.0, 9.0], "end": [9.0, 9.0, 9.0], "quiet": False},
        "configs": {"cluster1": conf([7210], [30_000]),
                    "cluster3": conf([7200, 7201, 7202], [9_000, 13_000, 10_000])},
    }  # fmt: skip
    lines = tables_scale.cluster_instructions({"instructions": block})
    (row,) = [line for line in lines if "13,000" in line]
    assert "2.31x (goal >= 2.5: **missed**)" in row
    assert not any("x (goal" in line for line in lines if "9,000" in line)
    assert "| 13,000 | 10.0 | 1,300 |" in row
    assert lines[-1].endswith("Redis Cluster, 3 masters 32,000._")
