"""The capacity settings, checked: ``conventions_limits`` and ``conventions_backpressure``.

The shapes the settings parse into (:class:`Limit`, :class:`Bound`) live here, below
the code that enforces them (``conventions.capacity.limits``, ``.backpressure``), so
that reading the settings imports none of it. A bad entry says the fix.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conventions.errors import ConfigurationError

#: seconds a concurrency slot's lease lasts unless renewed: a dead holder frees it after
#: seconds a concurrency slot's lease lasts unless renewed: a dead holder frees it after
DEFAULT_SLOT_LEASE = 15.0

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")
_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_UNITS |= {"h": 3600.0, "hour": 3600.0}


@dataclass(frozen=True)
class Limit:
    """One dependency's limits, as declared."""

    name: str
    #: seconds between two tokens, None when the dependency has no rate
    interval: float | None = None
    #: tokens that may be taken at once after an idle spell (1: evenly spaced)
    burst: int = 1
    #: calls at once across the fleet, None when uncapped
    concurrency: int | None = None
    #: seconds a slot's lease lasts unless renewed
    lease: float = DEFAULT_SLOT_LEASE

    @property
    def bucket(self) -> str:
        return f"limit:{self.name}"

    def slots(self) -> list[str]:
        """The slot lease names, starting at a random one (spreads the first tries)."""
        count = self.concurrency or 0
        start = random.randrange(count) if count else 0
        return [f"limit:{self.name}:{(start + i) % count}" for i in range(count)]


def parse_rate(text: str, where: str = "rate") -> float:
    """``"5/s"``, ``"100/m"``, ``"1/10s"`` -> seconds between two tokens."""
    match = _RATE.match(str(text).lower())
    unit = _UNITS.get(match.group(3)) if match else None
    if not match or unit is None or float(match.group(1)) <= 0:
        raise ConfigurationError(
            f"{where}: {text!r} is not a rate; write '<count>/<unit>' with a unit of "
            "s, m or h, e.g. '5/s', '100/m', '1/10s'"
        )
    return float(match.group(2) or 1) * unit / float(match.group(1))


def parse_limits(raw: Mapping[str, Any] | None) -> dict[str, Limit]:
    """The ``conventions_limits`` setting, checked: a bad entry says the fix."""
    limits: dict[str, Limit] = {}
    for name, declared in (raw or {}).items():
        where = f"conventions_limits[{name!r}]"
        spec = {"rate": declared} if isinstance(declared, str) else declared
        if not isinstance(spec, Mapping) or not set(spec) <= {
            "rate", "burst", "concurrency", "lease",
        }:  # fmt: skip
            raise ConfigurationError(
                f"{where}: write a rate ('5/s') or a dict with rate, burst, concurrency "
                f"and lease, e.g. {{'concurrency': 2}}; got {spec!r}"
            )
        rate, concurrency = spec.get("rate"), spec.get("concurrency")
        if rate is None and concurrency is None:
            raise ConfigurationError(f"{where}: give a rate, a concurrency, or both")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigurationError(f"{where}: concurrency must be a whole number >= 1")
        burst, lease = int(spec.get("burst", 1)), float(spec.get("lease", DEFAULT_SLOT_LEASE))
        if burst < 1 or lease <= 0:
            raise ConfigurationError(f"{where}: burst must be >= 1 and lease > 0 seconds")
        interval = parse_rate(rate, where) if rate is not None else None
        limits[name] = Limit(str(name), interval, burst, concurrency, lease)
    return limits


def check_uses(task: str, uses: tuple[str, ...], declared: Mapping[str, Limit]) -> None:
    """At definition time: every dependency a task uses is declared."""
    unknown = [name for name in uses if name not in declared]
    if unknown:
        raise ConfigurationError(
            f"{task}: uses={unknown} names undeclared dependencies; declare them in "
            f"conventions_limits in celeryconfig.py (declared: {sorted(declared)}), "
            "e.g. conventions_limits = {'smtp': '5/s'}"
        )


@dataclass(frozen=True)
class Bound:
    """The most a queue may hold before producers are refused."""

    queue: str
    max_depth: int | None = None
    #: seconds the oldest waiting job may have waited
    max_age: float | None = None


def parse_bounds(raw: Mapping[str, Any] | None) -> dict[str, Bound]:
    """The ``conventions_backpressure`` setting, checked."""
    bounds: dict[str, Bound] = {}
    for queue, spec in (raw or {}).items():
        if not isinstance(spec, Mapping) or not spec or not set(spec) <= {"max_depth", "max_age"}:
            raise ConfigurationError(
                f"conventions_backpressure[{queue!r}]: write {{'max_depth': N}}, "
                f"{{'max_age': seconds}} or both; got {spec!r}"
            )
        depth, age = spec.get("max_depth"), spec.get("max_age")
        bounds[queue] = Bound(
            queue, None if depth is None else int(depth), None if age is None else float(age)
        )
    return bounds
