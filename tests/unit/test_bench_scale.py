"""``bench.scale`` and ``bench.rabbitmq`` stay importable and their arithmetic right (no
server, no worker)."""

from __future__ import annotations

import os
import time

import pytest

from bench import scale


def test_a_process_cpu_time_is_read_from_proc() -> None:
    before = scale.beam_cpu(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn 50 ms of CPU
        pass
    after = scale.beam_cpu(os.getpid())
    assert before is not None and after is not None
    assert after - before >= 0.03
    assert scale.beam_cpu(None) is None


class FakeInfo:
    """The three INFO sections a meter reads, from made-up numbers (no server)."""

    def __init__(self) -> None:
        self.calls = {"cmdstat_evalsha": {"calls": 0}, "cmdstat_get": {"calls": 0}}
        self.cpu, self.memory = 1.0, 1000

    def config_resetstat(self) -> None:
        for stat in self.calls.values():
            stat["calls"] = 0

    def info(self, section: str) -> dict[str, object]:
        if section == "commandstats":
            return dict(self.calls)
        if section == "cpu":
            return {"used_cpu_user": self.cpu, "used_cpu_sys": 0.0}
        return {"used_memory": self.memory}


def test_a_phase_is_the_counters_difference_per_job() -> None:
    server = FakeInfo()
    meter = scale.Meter(server, "redis", "conv", [])
    server.calls["cmdstat_evalsha"]["calls"] = 300
    server.calls["cmdstat_get"]["calls"] = 100
    server.cpu += 0.05  # 50 ms of Redis CPU
    server.memory += 200_000
    phase = meter.done("run", 100)
    assert (phase.redis_commands, phase.redis_cpu_us, phase.redis_bytes) == (4.0, 500.0, 2000.0)
    assert list(phase.commands) == ["evalsha", "get"]  # the busiest first
    assert phase.rabbitmq_cpu_us is None and phase.redis_trips is None


def test_the_table_has_a_row_per_phase(capsys: pytest.CaptureFixture[str]) -> None:
    phase = scale.Phase("publish", "redis", "conv", 10, 1.0, 2.0, 1.0, 100.0, None, 50.0,
                        {"evalsha": 1.0}, {"evalsha": 1.0})  # fmt: skip
    scale._print([phase], as_json=False)
    rows = capsys.readouterr().out.splitlines()
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells == ["redis", "conv", "publish", "10", "1.0", "2", "100", "-", "50",
                     "evalsha 1", "evalsha 1"]  # fmt: skip


def test_the_rabbitmq_rows_are_rate_ratios_of_the_same_rounds() -> None:
    from bench import rabbitmq

    published = {"conv": [0.004] * 5, "raw_quorum": [0.002] * 5, "raw": [0.001] * 5}
    drained = {"conv": [90.0] * 5, "raw_quorum": [100.0] * 5, "raw": [200.0] * 5}
    rows = rabbitmq.rows(published, drained)
    assert [round(row.value, 2) for row in rows] == [0.5, 0.25, 0.9, 0.45, 0.5]
    assert [row.verdict() for row in rows[:1]] == ["met"]


def test_a_cluster_url_names_each_nodes_port_and_a_listener_is_found_by_its_port() -> None:
    import socket

    from bench import beam

    assert beam.ports("amqp://g:g@127.0.0.1:5700//;amqp://g:g@127.0.0.1:5701//;amqp://h//") == [
        5700, 5701, 5672,
    ]  # fmt: skip
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert beam.pids(f"amqp://127.0.0.1:{port}//") == [os.getpid()]
    assert beam.cpu_of([]) is None
