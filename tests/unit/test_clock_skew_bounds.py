"""The skew bounds (:mod:`conventions.transport.skew`): what the doctor and the keeper
make of a measured skew."""

from __future__ import annotations

import logging

import pytest

from conventions.ops.doctor import skew_findings
from conventions.ops.findings import ERROR, WARNING
from conventions.transport import skew


@pytest.mark.parametrize(
    ("found", "level"),
    [(0.3, None), (-1.9, None), (2.0, WARNING), (-4.9, WARNING), (5.0, ERROR), (-300.0, ERROR)],
)
def test_the_doctor_warns_on_a_skew_from_2s_and_refuses_from_5s(
    found: float, level: str | None
) -> None:
    findings = list(skew_findings("redis x:1", found))
    assert [f.level for f in findings] == ([level] if level else [])
    assert all(f.code == "clock-skew" and f"{found:+.1f}s" in f.message for f in findings)


def test_a_skew_is_the_midpoint_of_the_round_trip_and_a_slow_one_is_not_used() -> None:
    assert skew.between(100.0, 100.2, 80.0) == pytest.approx(20.1)
    assert skew.between(100.0, 101.0, 80.0) is None  # beyond MAX_ROUND_TRIP


def test_the_keeper_warns_once_while_the_skew_lasts_and_says_when_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = skew.Watch("consumer c1")
    with caplog.at_level(logging.INFO, logger="conventions.transport.skew"):
        for _ in range(3):
            watch.observe(100.0, 100.01, 80.0)
        watch.observe(100.0, 100.01, 100.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "+20.0s" in warnings[0].getMessage()
    assert "back within" in caplog.records[-1].getMessage()
    assert watch.skew == pytest.approx(0.005)
