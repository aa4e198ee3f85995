"""Small pure helpers of the pages: times, filters, scrubbed data (no web framework)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from conventions.config import durations
from conventions.tracing.scrubbing import scrub_text


def parse_since(text: str, now: datetime | None = None) -> datetime | None:
    """A filter's point in time (:func:`conventions.config.durations.parse_since`: the
    CLI's forms); None for an empty field. ``ValueError`` for anything else, a point
    before year 1 included (the caller's 400, never a 500)."""
    return durations.parse_since(text, now) if text.strip() else None


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
