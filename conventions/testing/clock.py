"""The virtual clock of a test: time that moves only when the test moves it.

The kit hands it to the app under test as Celery's ``app.now`` (so a countdown becomes
an ETA on this clock) and to the schedules as their clock offset, so that a retry due in
7.3 s, or tomorrow's daily occurrence, arrives when the test says so, without sleeping.
Time stamps the store writes (audit events, dead letters) stay on the real clock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo


class VirtualClock:
    """A clock that starts at ``start`` (default: now, to the second) and only moves
    forward, by ``advance`` or ``advance_to``."""

    def __init__(self, start: datetime | None = None) -> None:
        begin = start or datetime.now(UTC).replace(microsecond=0)
        if begin.tzinfo is None:
            begin = begin.replace(tzinfo=UTC)
        self.start: datetime = begin
        self._now = begin
        #: called with the current time before the clock moves (the kit collects what
        #: was published at the old time first)
        self.before_move: list[Callable[[datetime], object]] = []
        #: called with the new time after the clock moved
        self.after_move: list[Callable[[datetime], object]] = []

    def now(self, tz: tzinfo | None = None) -> datetime:
        """The virtual now (aware; in ``tz`` when given, else UTC)."""
        return self._now.astimezone(tz) if tz is not None else self._now

    @property
    def elapsed(self) -> float:
        """Seconds of virtual time since the start."""
        return (self._now - self.start).total_seconds()

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds`` (never back) and return the new now."""
        if seconds < 0:
            raise ValueError(f"a virtual clock only moves forward, not by {seconds} s")
        return self.advance_to(self._now + timedelta(seconds=seconds))

    def advance_to(self, moment: datetime) -> datetime:
        """Move forward to ``moment`` (a moment in the past leaves the clock where it is)."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        if moment <= self._now:
            return self._now
        for hook in list(self.before_move):
            hook(self._now)
        self._now = moment.astimezone(UTC)
        for hook in list(self.after_move):
            hook(self._now)
        return self._now

    def offset(self) -> float:
        """How far the virtual now is ahead of the real one (seconds)."""
        return (self._now - datetime.now(UTC)).total_seconds()

    def __repr__(self) -> str:
        return f"VirtualClock({self._now.isoformat()}, elapsed={self.elapsed:g}s)"
