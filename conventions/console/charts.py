"""The queues' charts: throughput, failures, retries and oldest age over the last hour or
day, drawn on the server as inline SVG (no script, no library, nothing fetched: the
console's content security policy holds as it is; colours come from the stylesheet's
``series-N`` classes, so the dark scheme has its own).

The points come from the store's per-minute samples (:mod:`conventions.store.series`):
a total's value in a bin is the sum of the increases between consecutive samples that
end in it (a counter that went down, a store emptied, counts as none); the oldest age
is the largest sampled in the bin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from typing import Any

from markupsafe import Markup

from conventions.store import series

#: the ranges a chart shows: name -> (length, bin width)
RANGES: Mapping[str, tuple[timedelta, timedelta]] = {
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=15)),
}
#: the charts of the page: (series field, title, unit shown on the axis)
CHARTS: tuple[tuple[str, str, str], ...] = (
    ("succeeded", "Processed", "jobs"),
    ("failed", "Dead-lettered", "jobs"),
    ("retried", "Retried", "jobs"),
    (series.OLDEST, "Oldest waiting", "s"),
)
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 360, 150, 40, 20, 8
#: the most queues drawn in distinct colours (more share the last one)
COLOURS = 8


@dataclass(frozen=True)
class Chart:
    """One chart: its field, title, bins' start times and a list of values per queue."""

    field: str
    title: str
    unit: str
    bins: list[datetime]
    lines: dict[str, list[float | None]]

    @property
    def peak(self) -> float:
        return max((v for line in self.lines.values() for v in line if v is not None), default=0)

    @property
    def total(self) -> dict[str, float]:
        return {q: sum(v or 0 for v in line) for q, line in self.lines.items()}


def binned(
    samples: Sequence[tuple[datetime, Mapping[str, Any]]],
    field: str,
    start: datetime,
    width: timedelta,
    count: int,
) -> dict[str, list[float | None]]:
    """Per queue, ``count`` bins of ``width`` from ``start``: increases of a total, or
    the largest oldest age (None: no sample in the bin)."""
    queues = sorted({q for _, row in samples for q in row})
    out: dict[str, list[float | None]] = {q: [None] * count for q in queues}
    previous: dict[str, float] = {}
    for at, row in samples:
        index = math.floor((at - start) / width)
        for queue in queues:
            value = (row.get(queue) or {}).get(field)
            if not isinstance(value, int | float):
                continue
            if field == series.OLDEST:
                point = float(value)
            else:
                before = previous.get(queue)
                previous[queue] = float(value)
                point = max(0.0, float(value) - before) if before is not None else 0.0
            if 0 <= index < count:
                held = out[queue][index]
                if held is not None:
                    point = max(held, point) if field == series.OLDEST else held + point
                out[queue][index] = point
    return out


def charts(
    samples: Sequence[tuple[datetime, Mapping[str, Any]]], until: datetime, name: str
) -> list[Chart]:
    """The page's charts over the range ``name`` ending at ``until``."""
    length, width = RANGES[name]
    count = int(length / width)
    start = series.minute(until) - width * (count - 1)
    bins = [start + width * i for i in range(count)]
    return [
        Chart(field, title, unit, bins, binned(samples, field, start, width, count))
        for field, title, unit in CHARTS
    ]


def _y(value: float, peak: float) -> float:
    inner = HEIGHT - TOP - BOTTOM
    return TOP + inner - (value / peak * inner if peak else 0)


def _path(line: Sequence[float | None], peak: float) -> str:
    """An SVG path through the points, broken where a bin has no sample (a point alone
    is drawn as a dot: a segment of no length with round caps)."""
    step = (WIDTH - LEFT - 4) / max(len(line) - 1, 1)
    parts, pen = [], "M"
    for i, value in enumerate(line):
        if value is None:
            pen = "M"
            continue
        parts.append(f"{pen}{LEFT + i * step:.1f},{_y(value, peak):.1f}")
        alone = pen == "M" and (i + 1 == len(line) or line[i + 1] is None)
        if alone:
            parts.append("h0.01")
        pen = "L"
    return " ".join(parts)


def svg(chart: Chart, queues: Sequence[str]) -> Markup:
    """``chart`` as an inline ``<svg>`` (every text escaped); ``queues`` fixes colours."""
    peak = chart.peak or 1.0
    label = f"{chart.title} per {'bin' if chart.unit == 'jobs' else 'sample'}"
    first, last = chart.bins[0], chart.bins[-1]
    out = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" data-chart="{escape(chart.field)}">',
        f'<line class="axis" x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH}" '
        f'y2="{HEIGHT - BOTTOM}"/>',
        f'<line class="grid" x1="{LEFT}" y1="{TOP}" x2="{WIDTH}" y2="{TOP}"/>',
        f'<text class="tick" x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end">'
        f"{_short(peak)}{'' if chart.unit == 'jobs' else ' s'}</text>",
        f'<text class="tick" x="{LEFT - 4}" y="{HEIGHT - BOTTOM}" text-anchor="end">0</text>',
        f'<text class="tick" x="{LEFT}" y="{HEIGHT - 4}">{first:%H:%M}</text>',
        f'<text class="tick" x="{WIDTH}" y="{HEIGHT - 4}" text-anchor="end">'
        f"{last:%H:%M} UTC</text>",
    ]
    for queue, line in chart.lines.items():
        colour = min(queues.index(queue) if queue in queues else 0, COLOURS - 1)
        drawn = _path(line, peak)
        if drawn:
            out.append(
                f'<path class="line series-{colour}" d="{drawn}" data-queue="{escape(queue)}" '
                'stroke-linecap="round" stroke-linejoin="round">'
                f"<title>{escape(queue)}</title></path>"
            )
    if not chart.bins or all(v is None for line in chart.lines.values() for v in line):
        out.append(
            f'<text class="tick" x="{(WIDTH + LEFT) / 2}" y="{HEIGHT / 2}" '
            'text-anchor="middle">no samples in this range yet</text>'
        )
    out.append("</svg>")
    return Markup("".join(out))


def _short(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"
