"""What every benchmark shares: the Redis database, interleaving, medians.

The benchmarks use their own Redis database (``BENCH_REDIS_URL``, default DB 14), empty
it between rounds, and pass it to every subprocess as ``REDIS_URL`` /
``CONVENTIONS_STORE_URL``. Nothing here runs at import: the unit smoke test imports the
modules without a Redis.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: what the ``lean`` variants turn off: results nobody reads, the STARTED state, the
#: "sent" event (``bench.apps`` and ``bench.apps_raw`` both use it)
LEAN: dict[str, Any] = {
    "task_ignore_result": True,
    "task_track_started": False,
    "task_send_sent_event": False,
}
#: ``tuned``: lean, and Celery's default prefetch (4 per process), still with late acks
TUNED: dict[str, Any] = {**LEAN, "worker_prefetch_multiplier": 4}
#: ``quiet``: tuned, and no task events (Flower then shows workers, not tasks)
QUIET: dict[str, Any] = {**TUNED, "worker_send_task_events": False}
#: the raw Celery variants (``bench.apps_raw``); the others are convention apps or peers
RAW = ("raw", "default", "raw_tuned")

#: the repository root (subprocesses run from it)
ROOT = Path(__file__).resolve().parent.parent
#: the benchmark's Redis database unless ``BENCH_REDIS_URL`` says otherwise
DEFAULT_URL = "redis://127.0.0.1:6379/14"


def url() -> str:
    return os.environ.get("BENCH_REDIS_URL", DEFAULT_URL)


def env() -> dict[str, str]:
    """The environment of every benchmark subprocess: our database for everything."""
    full = dict(os.environ)
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "SENTRY_DSN", "SMTP_URL"):
        full.pop(name, None)
    full.update(
        REDIS_URL=url(),
        CONVENTIONS_STORE_URL=url(),
        BENCH_REDIS_URL=url(),
        PYTHONPATH=str(ROOT),
    )
    # a benchmark runs on a throwaway Redis: the doctor's persistence check (an error
    # for workers) would refuse its workers; lowered here, as `make demo` does
    levels = full.get("CONVENTIONS_DOCTOR_LEVELS", "")
    if "redis-no-persistence=" not in levels:
        full["CONVENTIONS_DOCTOR_LEVELS"] = ",".join(
            part for part in (levels, "redis-no-persistence=warning") if part
        )
    return full


def use_bench_env() -> None:
    """Point this process at the benchmark database (before ``celeryconfig`` is read)."""
    os.environ.update({k: v for k, v in env().items() if k != "PYTHONPATH"})
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ.pop("CELERY_RESULT_BACKEND", None)


def python() -> str:
    return sys.executable


@dataclass
class Pairs:
    """Interleaved measurements of two variants, A then B, round after round."""

    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)

    def add(self, a: float, b: float) -> None:
        self.a.append(a)
        self.b.append(b)

    def ratios(self) -> list[float]:
        """``a / b`` of each pair (a rate of A over a rate of B, or B's time over A's)."""
        return [x / y for x, y in zip(self.a, self.b, strict=True) if y]

    def median_ratio(self) -> float:
        return median(self.ratios())


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def interleave(
    measure: Mapping[str, Callable[[], float]],
    rounds: int,
    *,
    on_round: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Run every variant once per round, A B C A B C ..., rotating the first each round
    so that no variant always runs first after a pause; return each one's values."""
    names = list(measure)
    values: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            values[name].append(measure[name]())
            on_round()
    return values


def ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Round by round ``num[i] / den[i]``: the pairs are the same round."""
    return [x / y for x, y in zip(num, den, strict=True) if y]
