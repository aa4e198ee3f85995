"""A signal to the worker wakes its event loop at once.

Celery's handlers for SIGTERM, SIGQUIT and SIGINT only set a flag (``should_stop``,
``should_terminate``); the event loop reads it between two polls. Python runs a handler
while the loop waits in ``epoll`` and then goes on waiting (PEP 475) until a socket is
ready or a timer is due. A worker of the layer's Redis transport with nothing to do
waits on its timers (kombu's wait up to 2 s) and on a fetch that blocks for seconds, so
a SIGTERM to an idle worker was seen late (0.54 to 0.71 s, measured), where kombu's stock
transport saw it at once (0 to 70 ms).

At ``worker_ready`` (main process) the loop gets a pipe of its own: Python writes a byte
to it for every signal it handles (:func:`signal.set_wakeup_fd`), and the loop reads the
pipe, so the poll returns and the next turn sees the flag. Nothing else changes: the
handlers are Celery's, and a process that already has a wake-up descriptor (another
library's) keeps its own and the loop is not woken (logged at debug). The pipe goes at
``worker_shutdown``; a pool process forked after the start (a child replaced after
``worker_max_tasks_per_child``) lets go of it (``worker_process_init``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("conventions.worker.signal_wake")


@dataclass
class _Wake:
    hub: Any
    read_fd: int
    write_fd: int
    pid: int


_installed: list[_Wake] = []


def install(hub: Any) -> bool:
    """Make a signal wake ``hub`` (a kombu event loop); True when it now does."""
    if hub is None or _installed or threading.current_thread() is not threading.main_thread():
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        logger.debug("a wake-up descriptor is set already (%d): signals do not wake the loop",
                     previous)  # fmt: skip
        return False
    wake = _Wake(hub, read_fd, write_fd, os.getpid())
    hub.add_reader(read_fd, _drain, read_fd)
    _installed.append(wake)
    return True


def _drain(read_fd: int) -> None:
    """Read what the signals wrote (the loop's turn is what was wanted, not the bytes)."""
    try:
        while os.read(read_fd, 512):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def uninstall() -> None:
    """``worker_shutdown``: the process's own wake-up descriptor off, the pipe closed."""
    if _installed and _installed[-1].pid == os.getpid():
        _release(_installed.pop(), owner=True)


def after_fork() -> None:
    """A forked process (``worker_process_init``): the parent's pipe is not its own."""
    if _installed and _installed[-1].pid != os.getpid():
        _release(_installed.pop(), owner=False)


def _release(wake: _Wake, owner: bool) -> None:
    if threading.current_thread() is threading.main_thread():
        current = signal.set_wakeup_fd(-1)
        if current != wake.write_fd:
            signal.set_wakeup_fd(current)  # not ours: left as it was
    if owner:
        with contextlib.suppress(Exception):  # the loop closed first: nothing to remove
            wake.hub.remove_reader(wake.read_fd)
    os.close(wake.read_fd)
    os.close(wake.write_fd)
