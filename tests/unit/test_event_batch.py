"""The window the worker's buffered task events are sent in
(:mod:`conventions.worker.event_batch`); the events themselves, through a real worker and
receiver, are in ``tests/integration/test_run_trips.py`` and the Flower tests."""

from __future__ import annotations

from typing import Any

import pytest

from conventions.worker import event_batch


class Hub:
    """The one method of kombu's hub the batcher calls: its timers, kept to fire later."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Any, tuple[Any, ...]]] = []

    def call_later(self, delay: float, callback: Any, *args: Any) -> None:
        self.timers.append((delay, callback, args))

    def fire(self) -> None:
        timers, self.timers = self.timers, []
        for _, callback, args in timers:
            callback(*args)


def test_the_window_is_the_setting_or_a_tenth_of_a_second() -> None:
    assert event_batch.flush_seconds({}) == event_batch.DEFAULT_FLUSH_SECONDS == 0.1
    assert event_batch.flush_seconds({"conventions_event_flush_seconds": "0.5"}) == 0.5
    assert event_batch.flush_seconds({"conventions_event_flush_seconds": 0}) == 0
    with pytest.raises(ValueError, match="conventions_event_flush_seconds"):
        event_batch.flush_seconds({"conventions_event_flush_seconds": -1})


def test_the_events_of_one_window_are_flushed_once_at_its_end() -> None:
    hub, flushed = Hub(), []
    batcher = event_batch.Batcher(0.1)
    for _ in range(30):  # thirty events buffered in the window
        batcher.buffered(hub, lambda: flushed.append(1))
    assert [delay for delay, _, _ in hub.timers] == [0.1]
    assert flushed == []
    hub.fire()
    assert flushed == [1]
    batcher.buffered(hub, lambda: flushed.append(2))  # the next window has its own
    hub.fire()
    assert flushed == [1, 2]


def test_a_timer_the_hub_dropped_is_asked_for_again_once_overdue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(event_batch, "monotonic", lambda: now[0])
    hub, flushed = Hub(), []
    batcher = event_batch.Batcher(0.1)
    batcher.buffered(hub, lambda: flushed.append(1))
    hub.timers.clear()  # a reset lost it
    now[0] += 0.5
    batcher.buffered(hub, lambda: flushed.append(1))
    assert hub.timers == []  # not yet overdue: the window may still be running
    now[0] += 1.0
    batcher.buffered(hub, lambda: flushed.append(1))
    hub.fire()
    assert flushed == [1]


def test_a_flush_that_fails_is_logged_not_raised() -> None:
    def broken() -> None:
        raise ConnectionError("the broker is gone")

    event_batch.Batcher(0.1).flush_now(broken)  # the consumer goes on stopping
