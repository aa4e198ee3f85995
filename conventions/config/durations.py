"""Durations and points in time as an operator types them, for every surface.

The ``conventions`` command (``--older-than 7d``, ``--since 2h``) and the console's
filters (``since=30m``) read the same forms through these two functions, so a value one
accepts the other accepts too, and an input no calendar can hold (``3000000d`` ago) is a
``ValueError`` with its reason, never an ``OverflowError``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def _seconds(text: str) -> float | None:
    """The seconds ``text`` says in the duration forms, or None when it is not one."""
    value = text.strip().lower()
    parts = _DURATION.findall(value)
    if not value or "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_duration(text: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``7d``, ``2w`` or a sum like ``1h30m``; never negative."""
    seconds = _seconds(text)
    if seconds is None:
        raise ValueError(
            f"invalid duration {text!r}: use a number and a unit s, m, h, d or w "
            "(e.g. 30m, 2h, 7d, 1h30m)"
        )
    try:
        return timedelta(seconds=seconds)
    except OverflowError as exc:
        raise ValueError(f"invalid duration {text!r}: too long") from exc


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A point in time, in UTC: a duration that long ago, or an ISO date or datetime
    (naive means UTC). ``ValueError`` for anything else, a point before year 1
    included."""
    seconds = _seconds(text)
    if seconds is not None:
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        except OverflowError as exc:
            raise ValueError(f"invalid time {text!r}: too far back (before year 1)") from exc
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: use an ISO date or datetime (2024-03-01, "
            "2024-03-01T12:00) or a duration meaning that long ago (30m, 2h, 7d)"
        ) from None
    try:
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except OverflowError as exc:  # 0001-01-01T00:00+23:59 is before year 1 in UTC
        raise ValueError(f"invalid time {text!r}: too far back (before year 1)") from exc
