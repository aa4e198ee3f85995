"""Two beat processes against one broker: each minute occurrence runs exactly once."""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tasks import app
from tests.acceptance import support_schedules as support
from tests.acceptance.schedule_helpers import beat_process, names
from tests.integration.helpers import wait_for

__all__ = ["beat_process"]  # the fixture, used by name

pytestmark = [pytest.mark.usefixtures("clean_store"), pytest.mark.chaos]


def test_two_beats_run_each_minute_once_and_record_the_other_send_as_deduplicated(
    worker_process: Callable[..., Any], beat_process: Callable[..., Any]
) -> None:
    env = {"CONVENTIONS_SCHEDULE": "tests.acceptance.support_schedules:TWO_BEATS"}
    entry = support.TWO_BEATS[0]
    worker_process("ticks", "email", include="tests.acceptance.support_schedules", **env)
    started = dt.datetime.now(dt.UTC)
    beat_process("beat-a", **env)
    beat_process("beat-b", **env)
    # both beats send the current minute at start, then a minute boundary passes: two
    # occurrences, each sent by both (one boundary keeps the suite's time down)
    last = entry.schedule.next_after(started)
    time.sleep(max((last - dt.datetime.now(dt.UTC)).total_seconds(), 0) + 8)
    occurrences = [
        entry.occurrence(moment)
        for moment in entry.schedule.between(started - dt.timedelta(minutes=1), last)
    ]
    assert len(occurrences) == 2
    for occurrence in occurrences:
        trail = wait_for(lambda o=occurrence: _settled(o.correlation_id), timeout=60, every=0.5)
        counts = Counter(names(trail))
        assert counts["succeeded"] == 1, (occurrence.label, names(trail))  # the body once
        # the other beat's send is absorbed at the publish (the business key's
        # reservation, or the send already recorded) or, when it came after the first
        # job had finished, by the ledger
        assert counts["deduplicated"] + counts["skipped_duplicate"] >= 1, names(trail)
        assert counts["published"] <= 2, names(trail)
        succeeded = next(e for e in trail if e.event == "succeeded")
        for duplicate in (e for e in trail if e.event == "deduplicated"):
            assert duplicate.detail["duplicate_of"] == succeeded.task_id
        ran = app.store.get_state(f"test:tick:{occurrence.key}")
        assert ran is not None and ran["task_id"] == succeeded.task_id


def _settled(correlation_id: str) -> list[Any] | None:
    """The trail once the run succeeded and the second send was absorbed."""
    trail = app.store.audit_for(correlation_id)
    found = set(names(trail))
    absorbed = {"deduplicated", "skipped_duplicate"} & found
    return trail if "succeeded" in found and absorbed else None
