"""The compact form of the Redis store's done entries (``conventions.store.redis_done``)."""

from __future__ import annotations

from conventions.store import redis_done


def test_a_fingerprint_round_trips_through_its_short_form() -> None:
    printed = "v1:0123456789abcdef"
    short = redis_done.short_print(printed)
    assert len(short) == 14 and "|" not in short
    assert redis_done.long_print(short) == printed


def test_a_fingerprint_of_another_form_is_kept_as_it_is() -> None:
    for printed in ("v1:aaaa", ":0123456789abcdef"[:5], "v2:not-hex-at-all!"):
        assert redis_done.long_print(redis_done.short_print(printed)) == printed
    assert redis_done.short_print(None) == "" and redis_done.long_print("") is None


def test_readers_look_from_the_farthest_day_a_keep_reaches_down_to_yesterday() -> None:
    day = 86400.0
    assert redis_done.days(7 * day, now=100 * day + 5) == list(range(108, 98, -1))
    assert redis_done.days(0, now=100 * day) == [101, 100, 99]


def test_an_entry_reads_back_with_its_owner_outcome_and_time_left() -> None:
    bucket = "cc:done:100"
    now = 100 * 86400.0
    # expires 1 s into day 100 (100 steps of 10 ms), owner and fingerprint, no outcome
    value = "0002s" + "3f2a9c1e|v1~ASNFZ4mrze8"
    assert redis_done.read([bucket], [value], now=now) == ["done", "3f2a9c1e", "succeeded", 1000]
    found = redis_done.read([bucket], ["0002sexec-a||charged"], now=now)
    assert found is not None and found[:3] == ["done", "exec-a", "charged"]
    assert redis_done.read([bucket], [value], now=now + 2) is None  # expired: not done
