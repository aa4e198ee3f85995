"""Small pure helpers of the pages: times, filters, scrubbed data (no web framework)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from conventions.tracing.scrubbing import scrub_text

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: datetime | None = None) -> datetime | None:
    """``30m``/``2h``/``7d`` ago, or an ISO date/datetime (UTC unless it says); None for
    an empty field. Raises ``ValueError`` for anything else, a duration reaching before
    year 1 included (``3000000d``: Python's dates overflow there, and an input error is
    the caller's 400, never a 500)."""
    text = text.strip()
    if not text:
        return None
    found = DURATION.match(text)
    try:
        if found:
            seconds = float(found.group(1)) * UNITS[found.group(2)]
            return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        moment = datetime.fromisoformat(text)
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError as exc:
        raise ValueError("too far back (before year 1)") from exc


def when(value: datetime | str | None) -> str:
    """A time as the CLI prints it (UTC, to the second); ``-`` for none."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
        return when(moment)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def scrubbed(value: Any) -> Any:
    """``value`` with every string scrubbed (e-mail addresses, card numbers, secrets),
    keys included: what the console shows of a payload or headers."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {scrubbed(str(k)): scrubbed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrubbed(v) for v in value]
    return value


def pretty(value: Any) -> str:
    """Scrubbed, indented JSON of ``value``."""
    return json.dumps(scrubbed(value), indent=2, sort_keys=True, default=str)
