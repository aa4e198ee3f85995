"""Dependency limit declarations and the token bucket step, without a store."""

from __future__ import annotations

import pytest

from conventions.config import capacity as limits
from conventions.errors import ConfigurationError
from conventions.store.tokens import Bucket, pause, step


@pytest.mark.parametrize(
    ("text", "interval"),
    [("5/s", 0.2), ("100/m", 0.6), ("1/10s", 10.0), ("3600/h", 1.0), ("2 / second", 0.5)],
)
def test_a_rate_reads_as_seconds_between_tokens(text: str, interval: float) -> None:
    assert limits.parse_rate(text) == pytest.approx(interval)


@pytest.mark.parametrize("text", ["5", "5/fortnight", "0/s", "-1/s", "fast"])
def test_a_bad_rate_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"'<count>/<unit>'"):
        limits.parse_rate(text)


def test_declarations_read_as_limits() -> None:
    declared = limits.parse_limits(
        {
            "smtp": "5/s",
            "payments_api": {"concurrency": 2, "lease": 5},
            "crm": {"rate": "1/s", "burst": 3},
        }
    )
    assert declared["smtp"] == limits.Limit("smtp", interval=0.2)
    assert declared["payments_api"].concurrency == 2
    assert declared["payments_api"].interval is None
    assert declared["crm"].burst == 3


@pytest.mark.parametrize(
    "spec",
    [{}, {"rate": "5/s", "colour": "red"}, {"concurrency": 0}, {"concurrency": 1.5}, 5],
)
def test_a_bad_declaration_is_refused(spec: object) -> None:
    with pytest.raises(ConfigurationError, match=r"conventions_limits\['x'\]"):
        limits.parse_limits({"x": spec})


def test_a_task_using_an_undeclared_dependency_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"declare them in conventions_limits"):
        limits.check_uses("email.send.v1", ("smtp", "sms"), limits.parse_limits({"smtp": "5/s"}))


def test_slot_names_cover_every_slot_once() -> None:
    limit = limits.Limit("api", concurrency=3)
    assert sorted(limit.slots()) == ["limit:api:0", "limit:api:1", "limit:api:2"]


def test_a_backlog_is_booked_one_interval_apart_and_used_no_closer() -> None:
    bucket, waits = Bucket(), []
    for _ in range(4):
        bucket, wait = step(bucket, 100.0, 0.2, 1, max_wait=60, booked=False)
        waits.append(round(wait, 6))
    assert waits == [0.0, 0.2, 0.4, 0.6]
    # two booked callers come back late and together: the second must wait again
    bucket, first = step(bucket, 101.0, 0.2, 1, max_wait=60, booked=True)
    bucket, second = step(bucket, 101.0, 0.2, 1, max_wait=60, booked=True)
    assert (first, round(second, 6)) == (0.0, 0.2)


def test_a_pause_is_only_extended() -> None:
    assert pause(pause(Bucket(), 10.0), 5.0).paused == 10.0
    _, wait = step(pause(Bucket(), 10.0), 4.0, 0.0, 1, max_wait=0, booked=False)
    assert wait == 6.0
