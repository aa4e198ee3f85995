"""A signal wakes the worker's event loop (conventions.worker.signal_wake), on kombu's
own hub and real signals: Celery's handlers only set a flag the loop reads between two
polls, so a loop that waits on a far timer must be woken by the signal itself."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.asynchronous import Hub
from kombu.asynchronous.timer import Timer

from conventions.worker import signal_wake

#: the loop's only timer: a poll that the signal does not wake waits this long
FAR = 20.0


@pytest.fixture
def hub() -> Iterator[Hub]:
    # a timer that lets the poll wait up to FAR (kombu's default caps a wait at 2 s)
    made = Hub(timer=Timer(max_interval=FAR))
    yield made
    signal_wake.uninstall()
    made.close()


@pytest.fixture
def handled() -> Iterator[list[int]]:
    """SIGUSR1 handled the way Celery handles SIGTERM: a flag set, nothing raised."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGUSR1, previous)


def _signal_soon() -> None:
    threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGUSR1)).start()


def test_a_signal_ends_the_loops_poll_before_its_timer(hub: Hub, handled: list[int]) -> None:
    fired: list[str] = []
    hub.call_later(FAR, fired.append, "timer")
    assert signal_wake.install(hub)
    loop = hub.create_loop()
    _signal_soon()
    started = time.monotonic()
    next(loop)  # a turn: its poll waits for the timer, and the signal arrives
    assert handled == [signal.SIGUSR1]
    assert not fired, "the poll ended on the timer, not on the signal"
    # unwoken, the poll waits out kombu's longest (fire_timers' max_delay, 10 s)
    assert time.monotonic() - started < 5
    # the pipe was read: the next turn waits again instead of spinning on it
    assert not _readable()


def _readable() -> bool:
    try:
        os.read(signal_wake._installed[-1].read_fd, 1)
    except BlockingIOError:
        return False
    return True


def test_another_wakeup_descriptor_is_kept(hub: Hub) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd)
    try:
        assert not signal_wake.install(hub)
        assert signal.set_wakeup_fd(write_fd) == write_fd  # still theirs
        assert not signal_wake._installed
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)


def test_uninstall_gives_the_descriptor_back(hub: Hub) -> None:
    assert signal_wake.install(hub)
    wake: Any = signal_wake._installed[-1]
    signal_wake.uninstall()
    assert signal.set_wakeup_fd(-1) == -1
    assert wake.read_fd not in hub.readers
    with pytest.raises(OSError):
        os.fstat(wake.write_fd)


def test_a_forked_process_lets_go_of_the_parents_pipe(hub: Hub) -> None:
    assert signal_wake.install(hub)
    parent_fd = signal_wake._installed[-1].write_fd
    pid = os.fork()
    if pid == 0:  # the child: as a pool process at worker_process_init
        signal_wake.after_fork()
        ok = signal.set_wakeup_fd(-1) == -1 and not signal_wake._installed
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert signal.set_wakeup_fd(parent_fd) == parent_fd  # the parent's is untouched
