"""Real worker processes whose wall clock is wrong: ``libfaketime`` (Debian's
``faketime``) under a ``celery`` subprocess, the monotonic clock kept real
(``FAKETIME_DONT_FAKE_MONOTONIC=1``): a drifting wall clock is what NTP skew is.

The offset is read from a file (``FAKETIME_TIMESTAMP_FILE``, ``FAKETIME_NO_CACHE=1``), so a
test moves the clock of a running worker by writing it (:meth:`SkewedClock.set`).

libfaketime 0.9.10 (Debian 12) answers ``EINVAL`` to ``clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME)`` when the monotonic clock is not faked, which is how Python's
``time.sleep`` waits: run as ``python -m tests.acceptance.support_faketime <celery
args>``, this module makes ``time.sleep`` wait on a lock's timeout instead (the same
monotonic wait, through ``sem_clockwait``), then runs ``celery``. Nothing else of the
worker is changed.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

#: where Debian and others install the preload library
LIBRARY_GLOBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def library() -> str | None:
    """The libfaketime preload library, or None when it is not installed."""
    if shutil.which("faketime") is None:
        return None
    for pattern in LIBRARY_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def require() -> str:
    """The library; a skip on a laptop without ``faketime``, a failure in CI (where
    ``.ci/run`` installs it)."""
    found = library()
    if found is None:
        message = "faketime (libfaketime) is not installed: apt-get install faketime"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class SkewedClock:
    """The wall clock offset of the processes started with :meth:`env` (seconds, may
    change while they run)."""

    def __init__(self, folder: Path, offset: float) -> None:
        self.file = folder / f"faketime-{id(self)}.rc"
        self.offset = 0.0
        self.set(offset)

    def set(self, offset: float) -> None:
        """Move the clock of every process reading this file (at its next clock read)."""
        text = f"{offset:+.3f}\n"
        partial = self.file.with_suffix(".tmp")
        partial.write_text(text)
        partial.replace(self.file)  # never a half-written offset
        self.offset = offset

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {
            **base,
            "LD_PRELOAD": require(),
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }


def launcher() -> list[str]:
    """The command that starts ``celery`` under a skewed clock (instead of ``python -m
    celery``)."""
    return [sys.executable, "-m", "tests.acceptance.support_faketime"]


def _sleep(seconds: float) -> None:
    """``time.sleep`` on a lock's timeout (a monotonic wait libfaketime leaves alone)."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    lock = threading.Lock()
    lock.acquire()
    lock.acquire(timeout=seconds)


if __name__ == "__main__":
    import time

    time.sleep = _sleep
    from celery.__main__ import main

    sys.argv = ["celery", *sys.argv[1:]]
    main()
