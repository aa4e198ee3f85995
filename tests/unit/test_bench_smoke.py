"""The benchmark harness stays importable and its arithmetic right (no Redis, no timing).

Benchmarks never run in ``make test``; this only keeps ``bench/`` from rotting: argument
parsing, ratios and medians of interleaved rounds, report rendering on made-up numbers,
and the raw Celery app's settings staying equal to the reliable profile it stands for.
"""

from __future__ import annotations

import cProfile
import json
import pstats
from pathlib import Path

import pytest

from bench import __main__ as cli
from bench import common, drain, growth, latency, launch, peer_apps, profile, publish
from bench.report import Report, Row


def test_sections_run_in_a_fixed_order_whatever_order_they_are_named_in() -> None:
    args = cli.parse(["profile", "drain", "--quick"])
    assert args.sections == ["drain", "profile"]
    assert cli.command_line(args) == "python -m bench drain profile --quick"
    assert cli.command_line(cli.parse([])) == "python -m bench"


def test_an_unknown_section_is_refused_with_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.parse(["drian"])
    assert "publish, drain" in capsys.readouterr().err


def test_quick_sizes_are_smaller_and_keep_at_least_five_rounds() -> None:
    assert cli.QUICK.rounds >= 5 and cli.FULL.rounds >= 5
    assert cli.QUICK.drain == 2_000 and cli.FULL.drain == 20_000
    assert cli.FULL.backlog == 100_000


def test_interleaving_rotates_which_variant_goes_first() -> None:
    calls: list[str] = []
    measure = {name: (lambda name=name: calls.append(name) or 1.0) for name in "abc"}
    values = common.interleave(measure, 3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert values == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}


def test_ratios_are_taken_round_by_round_then_the_median() -> None:
    rates = {"conv": [90.0, 80.0, 300.0], "raw": [100.0, 100.0, 100.0]}
    row = drain.ratio_row("drain", rates, "conv", "raw", ">= 0.85")
    assert row.value == pytest.approx(0.9)
    assert row.verdict() == "met"
    assert "100 jobs/s" in row.note


def test_publish_rows_compare_rates_not_times() -> None:
    times = {name: [0.002] * 5 for name in publish.CELERY_VARIANTS}
    times["raw"] = [0.001] * 5
    first = publish.rows(times, 5)[0]
    assert first.value == pytest.approx(0.5)  # twice the time: half the rate
    assert first.verdict() == "missed"


def test_latency_overhead_is_the_difference_of_the_p50s() -> None:
    times = {"conv": [0.005] * 99 + [0.05], "raw": [0.004] * 100}
    rows = latency.rows(times)
    assert rows[0].value == pytest.approx(1.0)
    assert rows[0].verdict() == "met"
    assert latency.percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_growth_ratio_is_backlog_rate_over_empty_rate() -> None:
    row = growth.ratio_row(
        "drain", {"empty": [100.0] * 5, "backlog": [50.0] * 5}, rates=True, unit="jobs/s"
    )
    assert row.value == pytest.approx(0.5)
    assert row.verdict() == "missed"


def test_report_renders_a_table_with_verdicts_and_saves_json(tmp_path: Path) -> None:
    report = Report(command="python -m bench --quick")
    report.add(Row("publish", "conv vs raw", 0.91, "x", ">= 0.85", "7 rounds"))
    report.add(Row("latency", "p50 overhead", 1.5, "ms", "<= 1"))
    report.add(Row("drain", "nothing measured", float("nan"), "x"))
    report.notes.append("peers: rq: not installed, skipped")
    text = report.markdown()
    assert "| publish | conv vs raw | 0.91x | >= 0.85 (met) | 7 rounds |" in text
    assert "1.50 ms | <= 1 (missed)" in text
    assert "| n/a |" in text
    assert "- peers: rq: not installed, skipped" in text
    report.save(tmp_path / "out.json")
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["rows"][0]["verdict"] == "met"


def test_profile_summary_reads_parts_from_a_real_profile() -> None:
    def trace_task() -> None:
        json.dumps({"a": 1})

    profiler = cProfile.Profile()
    profiler.runcall(trace_task)
    lines = profile.summary(pstats.Stats(profiler), jobs=1)
    assert len(lines) == len(profile.PARTS)
    dumps = next(line for line in lines if line.startswith("JSON dumps"))
    assert dumps.endswith("us/job")


def test_launch_splits_its_options_from_celerys_arguments() -> None:
    opts, rest = launch.parse(["--orjson", "--no-hiredis", "--", "-A", "x", "worker"])
    assert opts.orjson and opts.no_hiredis and opts.profile is None
    assert rest == ["-A", "x", "worker"]


def test_peers_name_their_queues_and_skip_what_is_not_installed() -> None:
    found, skipped = peer_apps.available()
    assert {peer.name for peer in found} | {note.split(":")[0] for note in skipped} == {
        "dramatiq",
        "huey",
        "rq",
    }
    assert peer_apps.PEERS["rq"].queue == "rq:queue:bench_rq"


def test_raw_celery_runs_the_same_reliable_settings_as_celeryconfig() -> None:
    from celery import current_app

    import celeryconfig

    before = current_app._get_current_object()
    from bench import apps_raw

    before.set_current()  # the raw apps made themselves current on import
    for name, value in apps_raw.RELIABLE.items():
        assert getattr(celeryconfig, name) == value, name
    assert apps_raw.raw.conf.task_acks_late is True
    assert apps_raw.default.conf.task_acks_late is False


def test_the_orjson_codec_keeps_the_json_wire_format() -> None:
    pytest.importorskip(
        "orjson", reason="orjson comes with the bench extra, which `make bench` installs"
    )
    from bench import codec

    text = codec.dumps({"order_id": "ord_1", "n": 1, "nested": {"x": [1, 2]}})
    assert json.loads(text) == {"order_id": "ord_1", "n": 1, "nested": {"x": [1, 2]}}
    assert codec.loads(text.encode()) == json.loads(text)
