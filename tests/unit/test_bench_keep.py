"""``bench.keep``'s expiry arithmetic: what a job leaves, for how long, and what that holds
at a rate (no server: the kinds are made up)."""

from __future__ import annotations

import pytest

from bench import keep


def _kind(name: str, size: float, life: float | None, cap: int | None = None) -> keep.Kind:
    return keep.Kind(name, 100, size, life, "raw", life, cap)


def test_keys_fall_in_their_kind_by_name_and_unknown_ones_by_shape() -> None:
    assert keep.kind_of("cc:run:rec:0b7e0c8e-4d3b-4a39-9f5e-2c4f1d7a9b10") == "run record"
    assert keep.kind_of("cc:run:ix:task:bench.noop_conv.v1") == "run index"
    assert keep.kind_of("cc:audit:by-time") == "audit index"
    assert keep.kind_of("celery-task-meta-abc") == "result"
    assert keep.kind_of("cc:deliveries:7") == "delivery counter"
    assert keep.kind_of("cc:newthing:0b7e0c8e-4d3b-4a39-9f5e-2c4f1d7a9b10") == "cc:newthing:*"


def test_what_stays_a_day_and_a_week_follows_each_kind_s_lifetime() -> None:
    kinds = [
        _kind("result", 400, keep.DAY - 5),  # read a few seconds after its write
        _kind("ledger", 200, keep.WEEK - 5),
        _kind("run record", 500, None),  # no expiry, no retention known: stays
        _kind("delivery counter", 100, 3600),
    ]
    assert keep.kept_after(kinds, keep.DAY) == 1100
    assert keep.kept_after(kinds, keep.WEEK) == 700


def test_the_steady_state_is_rate_times_lifetime_at_most_the_cap() -> None:
    kinds = [_kind("ledger", 200, keep.WEEK), _kind("run record", 500, keep.WEEK, cap=1000)]
    held = keep.steady_bytes(kinds, rate=100, window=keep.WEEK)
    assert held == pytest.approx(200 * 100 * keep.WEEK + 500 * 1000)
    uncapped = keep.steady_bytes(kinds, rate=100, window=keep.WEEK, capped=False)
    assert uncapped == pytest.approx(700 * 100 * keep.WEEK)
    summary = keep.summary(kinds)
    assert summary["gb_per_100_jobs_s_week"] == round(held / 1e9, 2)
    assert keep.kinds_of(summary) == kinds
