"""``bench.scale`` and ``bench.rabbitmq`` stay importable and their arithmetic right (no
server, no worker)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict

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


def _phase(variant: str, phase: str, cpu: float, trips: float = 2.0) -> dict[str, object]:
    row = scale.Phase(phase, "redis", variant, 10, 1.0, 20.0, trips, cpu, None, 50.0,
                      {"evalsha": 1.0}, {"evalsha": 1.0})  # fmt: skip
    return asdict(row)


def test_the_whole_job_ratio_is_the_median_of_the_rounds_ratios() -> None:
    def run(publish: float, ran: float) -> dict[str, object]:
        return {"phases": [_phase("x", "publish", publish), _phase("x", "run", ran)]}

    seen = {
        "conv": [run(100, 500), run(100, 700), run(100, 300)],
        "raw": [run(50, 250), run(50, 250), run(50, 250)],
    }
    (ratio,) = scale._ratios(seen)
    assert ratio["ratio"] == "conv/raw"
    assert ratio["cpu_rounds"] == [2.0, 2.67, 1.33]
    assert ratio["cpu"] == 2.0  # the median round, not the first
    assert (ratio["commands"], ratio["trips"]) == (1.0, 1.0)


def test_a_variant_s_phases_keep_the_first_round_s_trips_and_the_median_cpu() -> None:
    first = {"phases": [_phase("conv", "publish", 300, trips=2.0)]}
    second = {"phases": [_phase("conv", "publish", 100, trips=0.0)]}
    third = {"phases": [_phase("conv", "publish", 200, trips=0.0)]}
    (row,) = scale._median([first, second, third])
    assert row["redis_cpu_us"] == 200 and row["cpu_rounds"] == [300, 100, 200]
    assert row["redis_trips"] == 2.0


def test_the_costs_table_has_a_row_per_phase_and_says_which_run() -> None:
    from bench import tables

    data = {
        "command": "python -m bench.scale", "commit": "0123456789abcdef",
        "date": "2026-12-02T05:00:00Z",
        "cores": 2, "load": {"start": [3.0, 2.0, 1.0], "end": [1.0, 1.0, 1.0], "quiet": False},
        "phases": [_phase("conv", "publish", 150.4), _phase("raw", "run", 99.6)],
    }  # fmt: skip
    lines = tables.scale_costs(data)
    assert "commit `0123456789`" in lines[0] and "times and CPU figures are noisy" in lines[0]
    cells = [c.strip() for c in lines[4].strip("|").split("|")]
    assert cells == ["`conv`: the layer, reliable profile", "publish", "2.00", "20.0", "150"]
    assert len(lines) == 6


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


def test_a_run_is_noisy_when_the_hypervisor_took_its_share_of_the_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench import results, tables

    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3\n")
    before = results.cpu_ticks(stat)
    assert before == (35, 1000)
    stat.write_text("cpu  200 0 100 1600 20 0 10 70 0 0\n")
    after = results.cpu_ticks(stat)
    assert results.steal_share(before, after) == 0.035
    assert results.steal_share(None, after) is None
    assert results.cpu_ticks(tmp_path / "absent") is None

    # the run's end is read from a stat file of the test's own: the machine's real steal
    # between two readings (a loaded machine's hypervisor takes some) never moves it
    calm = {"average": [0.1, 0.1, 0.1], "cores": 2, "quiet": True, "ticks": (0, 1000)}
    stat.write_text("cpu  1000 0 500 7500 100 0 50 350 0 0\n")
    end = results.cpu_ticks(stat)
    assert end == (350, 9500)
    stolen = {**calm, "ticks": (end[0] - 100, end[1] - 1000)}
    data = results.meta("python -m bench x", stolen, stat=stat)
    # 100 of the 1,000 ticks since the made-up start were steal
    assert data["load"]["steal"] == 0.1
    assert data["load"]["quiet"] is False
    assert "hypervisor steal" in tables.caption(data)
    assert "a shared machine" in tables.caption(data)
    # the load at the end (the bench's own workers) does not make a calm run noisy
    unstolen = {**calm, "ticks": (end[0] - 1, end[1] - 1000)}
    assert results.meta("python -m bench x", unstolen, stat=stat)["load"]["quiet"] is True
    # and the machine's own /proc/stat is what a run reads by default
    real = results.load()["ticks"]
    assert real is not None and real[1] > 0


def test_a_command_whose_reply_is_skipped_is_no_round_trip() -> None:
    from bench import scale_meter

    counter = scale_meter.Trips(6379)  # not connected: lines are fed to it by hand
    lines = [
        (1, "MULTI"), (1, "ZREM unacked_index t1"), (1, "HDEL unacked t1"), (1, "EXEC"),
        (2, "CLIENT REPLY SKIP"), (2, "ZREM unacked_index t2"), (2, "CLIENT REPLY SKIP"),
        (2, "HDEL unacked t2"), (2, "BLMOVE q inbox RIGHT LEFT 5"),
        (3, "CLIENT REPLY SKIP"), (2, "EVALSHA abc 1 k"), (3, "EVAL live 2 a b"),
        (3, "PUBLISH x y"),
    ]  # fmt: skip
    for port, text in lines:
        counter._line({"command": text, "client_port": port, "client_address": "a"})
    assert dict(counter.count) == {"exec": 1, "blmove": 1, "evalsha": 1, "publish": 1}


def test_a_ratio_is_judged_by_its_median_and_says_how_many_rounds_disagree() -> None:
    from bench.tables import _judged

    assert _judged(1.2, [1.1, 1.2, 1.25], 1.3) == "met"
    assert _judged(1.25, [1.11, 1.24, 1.5, 1.38, 1.25], 1.3) == (
        "met by the median, 2 of 5 rounds above"
    )
    assert _judged(1.4, [1.35, 1.4, 1.45], 1.3) == "**missed**"
    assert _judged(1.36, [1.65, 1.08, 1.36, 1.31, 1.42], 1.3) == "**missed**, 1 of 5 rounds below"


def test_the_trip_counter_in_detail_names_the_skipped_replies_and_the_channels() -> None:
    from bench.scale_meter import TripCounter

    def line(command: str, port: int = 1, lua: bool = False) -> dict[str, object]:
        return {"command": command, "client_address": "127.0.0.1", "client_port": str(port),
                "client_type": "lua" if lua else "tcp"}  # fmt: skip

    stream = [
        line("CLIENT REPLY SKIP"),
        line("ZREM unacked_index t1"),  # a held ack: no trip
        line("CLIENT REPLY SKIP"),
        line("HDEL unacked t1"),
        line("EVALSHA abc 1 k"),
        line("HSET k a b", lua=True),  # the script is one
        line("MULTI", 2),
        line("ZREM x y", 2),
        line("BLMOVE a b RIGHT LEFT 1"),  # other client
        line("EXEC", 2),
        line("PUBLISH /0.celeryev/task.succeeded x", 3),
        line("INFO cpu"),
    ]
    # Trips counts the same without the detail (the test above)
    detailed = TripCounter(detail=True)
    assert [k for k in (detailed.key(x) for x in stream) if k] == [
        "zrem:no-reply",
        "hdel:no-reply",
        "evalsha",
        "blmove",
        "exec",
        "publish:task.succeeded",
    ]


def test_settle_waits_for_a_quiet_machine_and_gives_up_after_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import results

    readings = iter([{"quiet": False, "average": [1.6, 1.2, 0.9], "cores": 2}] * 2
                    + [{"quiet": True, "average": [0.4, 0.9, 0.8], "cores": 2}])  # fmt: skip
    monkeypatch.setattr(results, "load", lambda: next(readings))
    assert results.settle(60, poll=0)["quiet"] is True  # the third reading
    busy = {"quiet": False, "average": [3.0, 3.0, 3.0], "cores": 2}
    monkeypatch.setattr(results, "load", lambda: busy)
    assert results.settle(0, poll=0) is busy  # no wait asked: measured as it is
