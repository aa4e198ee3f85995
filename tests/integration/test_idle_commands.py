"""An idle real worker sends its Redis at most 2 commands a second, whatever its queues.

A real ``celery -A tasks worker`` (the reliable profile: events on, the layer's
transport, the keeper, the store) on ``email`` and on ``email,heavy`` (the reference
app's queues; a consumer of several lists sends the same fetch whatever their number:
one ``BLPOP`` over their bells, one sweep) on a ``redis-server`` of the test's own, so that every
command the server sees is the worker's: after a warm-up (the fetch's back-off at its
longest, the first beats and sweeps done), ``MONITOR`` counts what clients send over
about 10 s (a script counts once; what it runs inside does not). The count is a rate of
timers, not a speed: a loaded machine sends fewer, never more. Over its :data:`CEILING` it
fails (a regression); between the issue's bound and it, it is an expected failure (the
bound is not met by a lone worker yet: see the module's constants).
"""

from __future__ import annotations

import collections
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.fixtures import WorkerProcess, unavailable
from tests.integration.helpers import SpareRedis

#: 34 s a queue set (a warm-up, then 10 s counted): in make chaos, not make test's 20
#: minutes
pytestmark = pytest.mark.chaos

#: the issue's bound (#32): commands per second an idle worker sends, whatever its queues
BOUND = 2.0
#: seconds idle before counting (fetch back-off at its longest, the first beat and sweep
#: done: their scripts sent whole once, past the window)
WARM_UP = 22.0
#: seconds counted
WINDOW = float(__import__("os").environ.get("CC_IDLE_WINDOW", "10"))
STOP = "cc-idle-count-stop"


class Count:
    """What clients other than this one send the server while the block runs."""

    def __init__(self, port: int) -> None:
        self.client = redis.Redis(port=port)
        self.commands: collections.Counter[str] = collections.Counter()
        self._monitor = self.client.monitor()
        self._connection = self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        try:
            for line in self._connection.listen():
                if STOP in line["command"]:
                    return
                if line.get("client_type") != "lua":
                    self.commands[line["command"].split()[0].upper()] += 1
        except redis.ConnectionError:
            return

    def __enter__(self) -> Count:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.client.echo(STOP)
        self._thread.join(10)
        self._connection.connection.disconnect()
        self.client.close()


@pytest.fixture
def own_redis() -> Iterator[SpareRedis]:
    if shutil.which("redis-server") is None:
        unavailable("redis-server (a server of the test's own)", FileNotFoundError("redis-server"))
    spare = SpareRedis()
    spare.start()
    yield spare
    spare.stop()


#: what it may send at most today, by its queues (issue #32, 2026-12-02, counted steady:
#: 2.4 to 2.7 on one queue, 2.9 to 3.1 on two; before, about 3.4 and 4.6): above it, a
#: regression. Between the issue's bound and it the test is an expected failure: a lone
#: worker holds every mover turn (1/s), and Celery's heartbeat event (0.5/s) and the
#: pause watch (0.2/s per queue) come on top
CEILING = {"email": 3.0, "email,heavy": 3.8, "email,heavy,q3,q4,q5": 5.0}


@pytest.mark.parametrize("queues", sorted(CEILING))
def test_an_idle_worker_sends_at_most_two_commands_a_second_whatever_its_queues(
    queues: str, own_redis: SpareRedis, worker_process: Callable[..., WorkerProcess]
) -> None:
    base = f"redis://127.0.0.1:{own_redis.port}"
    env: dict[str, Any] = {"REDIS_URL": f"{base}/0", "CONVENTIONS_STORE_URL": f"{base}/1",
                           "CONVENTIONS_TEST_QUEUES": queues}  # fmt: skip
    worker_process("idle", queues, concurrency=1, **env)
    time.sleep(WARM_UP)  # a rate of timers: nothing here waits on a speed
    with Count(own_redis.port) as count:
        started = time.monotonic()
        time.sleep(WINDOW)
        took = time.monotonic() - started
    rate = sum(count.commands.values()) / took
    table = ", ".join(f"{name} {n / took:.2f}/s" for name, n in count.commands.most_common())
    print(f"idle worker on {queues}: {rate:.2f} commands/s ({table})")
    ceiling = CEILING[queues]
    assert rate <= ceiling, f"{rate:.2f} commands/s idle (at most {ceiling} today): {table}"
    if rate > BOUND:
        pytest.xfail(f"issue #32 not met yet: {rate:.2f} commands/s idle, over {BOUND}")
