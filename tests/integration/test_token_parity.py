"""The Redis store's token bucket (Lua) and the SQL store's (``tokens.step``, Python)
give the same answers: the same wait, the same token taken or not, the same bucket left.

The Lua scripts are the store's own text with one change: the clock. They read Redis'
``TIME``; here they read the instant the Python step is given, so both run the same
sequence of instants. The sequence is random from a fixed seed, printed: a failure
prints the step to replay.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import redis

from conventions.store import redis_coordination as lua
from conventions.store.tokens import Bucket, pause, step

SEED = 20261201
STEPS = 1500
#: (interval, burst) of a few dependencies: a cap-only bucket (interval 0) included
SHAPES = [(0.0, 1), (0.05, 1), (0.2, 1), (0.2, 5), (1.0, 3), (10.0, 1)]
CLOCK = """local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end"""


def _on_given_clock(script: str) -> str:
    """The script with its clock read from its last argument instead of ``TIME``."""
    assert script.count(CLOCK) == 1, "the bucket scripts' clock changed: update CLOCK"
    return script.replace(CLOCK, "local function now() return tonumber(ARGV[#ARGV]) end")


@pytest.fixture
def client(store_redis: redis.Redis) -> redis.Redis:
    return store_redis


def _stored(client: redis.Redis, key: str) -> Bucket:
    tat, use, paused = client.hmget(key, "tat", "use", "paused")
    return Bucket(float(tat or 0), float(use or 0), float(paused or 0))


def _same(lua_bucket: Bucket, py_bucket: Bucket) -> bool:
    """Equal as Lua stores them (``%.6f``)."""
    return all(
        abs(getattr(lua_bucket, f) - getattr(py_bucket, f)) <= 1e-6
        for f in ("tat", "use", "paused")
    )


def test_the_lua_bucket_and_the_python_step_agree_on_every_step(client: redis.Redis) -> None:
    print(f"\ntoken bucket parity: seed {SEED}, {STEPS} steps")
    rng = random.Random(SEED)
    take = client.register_script(_on_given_clock(lua._TAKE_TOKEN))
    hold = client.register_script(_on_given_clock(lua._PAUSE_TOKENS))
    keys = {shape: f"parity:{uuid.uuid4().hex}:{shape}" for shape in SHAPES}
    now, took = 1_000_000.0, 0
    for n in range(STEPS):
        now += rng.choice([0.0, rng.uniform(0, 0.3), rng.uniform(0, 3.0)])
        (interval, burst) = shape = rng.choice(SHAPES)
        key = keys[shape]
        before = _stored(client, key)
        where: dict[str, Any] = {"step": n, "seed": SEED, "now": now, "shape": shape}
        if rng.random() < 0.05:  # a 429 pauses the bucket
            seconds = rng.choice([0.0, 0.5, 3.0, 30.0])
            hold(keys=[key], args=[repr(seconds), repr(now)])
            expected = pause(before, now + seconds)
            assert _same(_stored(client, key), expected), where
            continue
        max_wait, booked = rng.choice([0.0, 1.0, 60.0]), rng.random() < 0.3
        where |= {"max_wait": max_wait, "booked": booked, "before": before}
        wait = float(take(keys=[key], args=[repr(interval), burst, repr(max_wait),
                                            int(booked), repr(now)]))  # fmt: skip
        after, expected_wait = step(before, now, interval, burst, max_wait=max_wait,
                                    booked=booked)  # fmt: skip
        assert (wait == 0) == (expected_wait == 0), where  # the same token taken, or not
        assert abs(wait - expected_wait) <= 1e-6, where | {"lua": wait, "py": expected_wait}
        assert _same(_stored(client, key), after) or not client.exists(key), where
        took += wait == 0
    print(f"{took} tokens taken, {STEPS - took} waits or pauses")
    assert 0 < took < STEPS  # the sequence took tokens and was refused some
