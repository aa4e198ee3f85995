"""``bench.scale``'s ``MONITOR`` counter (:class:`bench.scale_meter.Trips`) under load:
its reader falls far behind the server (here: a reader slowed per line), and a phase's
take waits for its marker as long as the reader moves, failing only once it stops. It
gave up after a fixed 30 s before, whatever the reader was doing. On the test's Redis
(``TEST_REDIS_URL``), no timing asserted."""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from bench import scale_meter
from tests.conftest import REDIS_BASE

pytestmark = [pytest.mark.timeout(120)]

PINGS = 1500
ADDRESS = urlsplit(REDIS_BASE)
HOST, PORT = ADDRESS.hostname or "localhost", ADDRESS.port or 6379


class SlowReader(scale_meter.Trips):
    """A reader that takes a millisecond and more per line: far behind the server."""

    def _line(self, command: dict[str, Any]) -> None:
        time.sleep(0.002)
        super()._line(command)


class StuckReader(scale_meter.Trips):
    """A reader that stops at the first command after it is told to."""

    stuck = threading.Event()
    released = threading.Event()

    def _line(self, command: dict[str, Any]) -> None:
        if self.stuck.is_set():
            self.released.wait(60)
        super()._line(command)


def trips(kind: type[scale_meter.Trips]) -> scale_meter.Trips:
    try:
        redis.Redis(host=HOST, port=PORT).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_BASE}: {exc}")
    return kind(PORT, stall=0.3, host=HOST)


def test_a_take_waits_for_a_reader_far_behind_while_it_reads() -> None:
    with trips(SlowReader) as counter:
        counter.take()  # the pings that waited for MONITOR to listen
        other = redis.Redis(host=HOST, port=PORT)
        pipe = other.pipeline(transaction=False)
        for _ in range(PINGS):
            pipe.ping()
        pipe.execute()

        taken = counter.take()  # seconds behind: ten times the stall window and more

    assert taken["ping"] == PINGS


def test_a_take_gives_up_once_the_reader_stops() -> None:
    with trips(StuckReader) as counter:
        counter.take()
        StuckReader.stuck.set()
        try:
            with pytest.raises(TimeoutError, match=r"read nothing for 0\.3 s"):
                counter.take()
        finally:
            StuckReader.released.set()
