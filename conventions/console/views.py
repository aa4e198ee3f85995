"""Small pure helpers of the pages: times, filters, scrubbed data (no web framework)."""

from __future__ import annotations

import json
import re
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


#: the packages whose frames a traceback folds: the layer's own and Celery's plumbing
LAYER_PACKAGES = ("conventions", "celery", "kombu", "billiard", "vine")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+')


def is_layer_frame(path: str) -> bool:
    """Is ``path`` (a traceback's ``File "..."``) the layer's or Celery's code?"""
    folders = path.replace("\\", "/").split("/")[:-1]
    return any(folder in LAYER_PACKAGES for folder in folders)


def frames(traceback: str) -> list[tuple[bool, str]]:
    """``traceback`` cut into runs of lines: (folded, text), where folded runs are the
    layer's and Celery's frames, so that the page opens on the user's code. The header
    line and the exception lines stay unfolded."""
    runs: list[tuple[bool, list[str]]] = []
    folded = False
    for line in traceback.splitlines():
        found = _FRAME.match(line)
        if found:
            folded = is_layer_frame(found.group("path"))
        elif not line.startswith((" ", "\t")):
            folded = False  # "Traceback ...", "The above exception ...", "Error: ..."
        if runs and runs[-1][0] == folded:
            runs[-1][1].append(line)
        else:
            runs.append((folded, [line]))
    return [(fold, "\n".join(lines)) for fold, lines in runs]


def cause(exc_type: str, message: str, traceback: str) -> str:
    """What went wrong, as the exception said it (``CardDeclined: card declined``): the
    traceback's last exception line when there is one, else the type and the message."""
    for line in reversed(traceback.strip().splitlines()):
        if line and not line.startswith((" ", "\t")) and ":" in line:
            head = line.split(":", 1)[0]
            if head and " " not in head:
                return line.strip()
        if line.strip():
            break
    return f"{exc_type}: {message}" if message else exc_type
