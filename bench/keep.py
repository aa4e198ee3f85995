"""What a finished job leaves in Redis, by kind of key, and how long each kind stays.

Read after ``bench.scale``'s run phase, on its own Redis: every key is put in a kind by
its name (:data:`KINDS`; a key of no known kind gets its name with ids blotted out, so a
new kind shows up under its own shape), and a sample of each kind is read with
``MEMORY USAGE`` (its bytes, Redis' per-key overhead included), ``PTTL`` (how long it
still has) and ``OBJECT ENCODING``. A kind's bytes per job are its keys' bytes
(the sample's mean times the count) over the jobs run.

How long a job's bytes stay is expiry arithmetic on those TTLs, not a wait: a kind
stays its TTL; a kind of keys with no TTL that the layer purges (an index, a run record)
stays its retention when the settings say one (``purged_after``), else until a cap or
for ever. "Kept after a day" is what lives at least a day; the steady state at a rate
is ``bytes per job x rate x min(lifetime, window)``, each kind at most its cap.
"""

from __future__ import annotations

import fnmatch
import random
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any

#: each kind of per-job key, by the first name pattern that matches (the order matters:
#: a record before its index); an index follows its records' lifetime
KINDS: tuple[tuple[str, str], ...] = (
    ("run record", "cc:run:rec:*"),
    ("run index", "cc:run:*"),
    ("audit trail", "cc:audit:log:*"),
    ("audit index", "cc:audit:by-time"),
    ("result", "celery-task-meta-*"),
    ("ledger done", "cc:done:*"),  # a field per finished job in a hash per day
    ("ledger", "cc:ledger:*"),
    ("delivery counter", "cc:deliveries:*"),
    ("dedup", "cc:dedup:*"),
    ("dedup fingerprint", "cc:print:*"),
)
#: an index's entries live as long as the records they point at
FOLLOWS = {"run index": "run record", "audit index": "audit trail"}
#: keys read per kind (the rest are counted, not read)
SAMPLE = 300
DAY = 86_400.0
WEEK = 7 * DAY
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{16,}|\d+")


@dataclass
class Kind:
    """One kind of key after the run: how many, how big, how long it stays."""

    kind: str
    keys: int
    #: bytes per job (``MEMORY USAGE``, the kind's total over the jobs run)
    bytes_per_job: float
    #: the sample's median remaining TTL, seconds (None: the keys have none)
    ttl_seconds: float | None
    #: ``OBJECT ENCODING`` of the sample, the most common first
    encoding: str
    #: how long a job's bytes of this kind stay, seconds (None: until a cap or for ever)
    lifetime_seconds: float | None
    #: the most items the layer keeps of this kind (None: no cap)
    cap: int | None = None


def shape(key: str) -> str:
    """A key's name with its ids blotted out: ``cc:foo:123`` -> ``cc:foo:*``."""
    return _ID.sub("*", key)


def kind_of(key: str) -> str:
    for name, pattern in KINDS:
        if fnmatch.fnmatchcase(key, pattern):
            return name
    return shape(key)


def read(client: Any, jobs: int, limits: dict[str, dict[str, float]] | None = None) -> list[Kind]:
    """Every kind of key in ``client``'s database after ``jobs`` jobs. ``limits``: per kind,
    ``purged_after`` (seconds) and ``cap`` (items), from the layer's settings."""
    by_kind: dict[str, list[bytes]] = {name: [] for name, _ in KINDS}  # absent ones too
    for key in client.scan_iter(count=10_000):
        by_kind.setdefault(kind_of(key.decode()), []).append(key)
    rng = random.Random(32)  # a fixed sample: reruns read the same keys
    found = [_kind(client, name, keys, jobs, rng) for name, keys in by_kind.items()]
    known = {name for name, _ in KINDS}
    # a shape with a handful of keys (the counters, a queue, a binding) is not per job
    kinds = [k for k in found if k.kind in known or k.keys > max(3, jobs // 100)]
    limits = limits or {}
    for item in kinds:
        ttl = item.ttl_seconds
        rule = limits.get(FOLLOWS.get(item.kind, item.kind), {})
        if item.kind in FOLLOWS:
            followed = next((k for k in kinds if k.kind == FOLLOWS[item.kind]), None)
            ttl = followed.ttl_seconds if followed is not None else None
        purged = rule.get("purged_after")
        item.lifetime_seconds = ttl if ttl is not None else purged
        if rule.get("cap"):
            item.cap = int(rule["cap"])
    return kinds


def _kind(client: Any, name: str, keys: list[bytes], jobs: int, rng: random.Random) -> Kind:
    sample = keys if len(keys) <= SAMPLE else rng.sample(keys, SAMPLE)
    pipe = client.pipeline(transaction=False)
    for key in sample:
        pipe.memory_usage(key, samples=0)
        pipe.pttl(key)
        pipe.object("encoding", key)
    replies = pipe.execute()
    sizes = [int(r or 0) for r in replies[0::3]]
    ttls = [int(r) for r in replies[1::3] if int(r) >= 0]
    encodings = [r.decode() if isinstance(r, bytes) else str(r) for r in replies[2::3]]
    common = sorted(set(encodings), key=lambda e: -encodings.count(e))
    total = statistics.fmean(sizes) * len(keys) if sizes else 0.0
    return Kind(
        kind=name,
        keys=len(keys),
        bytes_per_job=round(total / jobs, 1),
        ttl_seconds=round(statistics.median(ttls) / 1000) if ttls else None,
        encoding=", ".join(common),
        lifetime_seconds=None,
    )


def stays(item: Kind, horizon: float) -> bool:
    """Whether a job's bytes of ``item`` are still there ``horizon`` seconds after it ran
    (a TTL read a few seconds after its write counts as its full length)."""
    life = item.lifetime_seconds
    return life is None or life >= horizon * 0.99


def kept_after(kinds: list[Kind], horizon: float) -> float:
    """Bytes per job still there ``horizon`` seconds after the job."""
    return round(sum(k.bytes_per_job for k in kinds if stays(k, horizon)), 1)


def steady_bytes(kinds: list[Kind], rate: float, window: float, capped: bool = True) -> float:
    """Bytes held after ``window`` seconds at ``rate`` jobs/s: each kind's jobs within its
    lifetime (the window when it has none), at most its cap when ``capped``."""
    total = 0.0
    for item in kinds:
        life = window if item.lifetime_seconds is None else min(item.lifetime_seconds, window)
        held = rate * life
        if capped and item.cap is not None:
            held = min(held, item.cap)
        total += held * item.bytes_per_job
    return total


def summary(kinds: list[Kind]) -> dict[str, Any]:
    """What the result file keeps: every kind, and the figures the docs quote."""
    gigabyte = 1e9
    return {
        "kinds": [asdict(k) for k in kinds],
        "bytes_per_job": round(sum(k.bytes_per_job for k in kinds), 1),
        "kept_after_day": kept_after(kinds, DAY),
        "kept_after_week": kept_after(kinds, WEEK),
        "gb_per_100_jobs_s_week": round(steady_bytes(kinds, 100, WEEK) / gigabyte, 2),
        "gb_per_100_jobs_s_week_uncapped": round(
            steady_bytes(kinds, 100, WEEK, capped=False) / gigabyte, 2
        ),
    }


def kinds_of(data: dict[str, Any]) -> list[Kind]:
    """The kinds back from a result file's ``summary``."""
    return [Kind(**row) for row in data["kinds"]]
