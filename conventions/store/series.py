"""Per-minute samples of every queue, for the console's charts: a small time series kept
in the store's state documents (``Store.put_state``), on every backend alike.

What a job does is already counted by the store in the same step as its audit event
(:mod:`conventions.store.counts`, no extra round trip per job); a *sampler*
(:mod:`conventions.ops.sampler`: the console, the metrics exporter and the watchdog call
it) copies, at most once a minute, each queue's cumulative totals (published,
succeeded, failed, retried) and its oldest waiting job's age into the sample of that
minute. A chart's "per minute" is the difference between two samples, so two samplers
writing the same minute agree, a lost sample is a gap (never a double count), and the
counters' own writes cost nothing more.

One document per hour (``series:<YYYY-MM-DDTHH>``, UTC) holds that hour's minutes and
lives ``KEEP`` seconds: a day's chart reads 25 small documents, an hour's two.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from conventions.store.base import Store

#: the cumulative totals a sample keeps per queue, then the oldest age (seconds)
TOTALS: Final = ("published", "succeeded", "failed", "retried")
OLDEST: Final = "oldest"
#: how long an hour's document is kept (seconds): a day's chart and one hour more
KEEP: Final = 25 * 3600.0
#: the state document's name of an hour (a format of the hour's UTC start)
NAME: Final = "series:{:%Y-%m-%dT%H}"

#: one queue's sample: each of ``TOTALS`` (an int) and ``OLDEST`` (seconds, or None)
Sample = Mapping[str, float | int | None]


def minute(moment: datetime) -> datetime:
    """``moment`` in UTC, down to its minute."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def _name(moment: datetime) -> str:
    return NAME.format(minute(moment))


def has(store: Store, at: datetime) -> bool:
    """Is there a sample for the minute of ``at`` already?"""
    found = store.get_state(_name(at)) or {}
    return f"{minute(at).minute:02d}" in (found.get("m") or {})


def record(store: Store, at: datetime, queues: Mapping[str, Sample]) -> None:
    """Keep ``queues`` (queue -> sample) as the sample of the minute of ``at``.

    A read and a write of the hour's document: two samplers writing other minutes of
    one hour at the same instant may lose one of them (a gap in the chart)."""
    name = _name(at)
    found = store.get_state(name) or {}
    minutes = dict(found.get("m") or {})
    minutes[f"{minute(at).minute:02d}"] = {q: dict(s) for q, s in queues.items()}
    store.put_state(name, {"v": 1, "m": minutes}, KEEP)


def read(store: Store, since: datetime, until: datetime) -> list[tuple[datetime, dict[str, Any]]]:
    """The samples from ``since`` to ``until`` (both included), oldest first: each
    minute's time and its queues' samples."""
    start, end = minute(since), minute(until)
    hour = start.replace(minute=0)
    out: list[tuple[datetime, dict[str, Any]]] = []
    while hour <= end:
        found = store.get_state(_name(hour)) or {}
        for label, queues in sorted((found.get("m") or {}).items()):
            at = hour.replace(minute=int(label))
            if start <= at <= end and isinstance(queues, dict):
                out.append((at, queues))
        hour += timedelta(hours=1)
    return out
