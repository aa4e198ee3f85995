"""Publish cost: ``.delay()`` of a convention task vs raw Celery's, and the peers'.

Every variant publishes from its own process (:mod:`bench.publisher`); the rounds are
interleaved (each round publishes ``n`` jobs of every variant, the first one rotating),
and each round's ratio is taken between variants of that same round. Nothing consumes;
the queues are emptied between rounds. The convention task validates the kwargs, derives
the key, reserves it in the store (one round trip, its audit event included) and adds its
headers; raw Celery sends the same id-only kwargs with the same reliable settings.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import partial
from typing import Any

from bench import common
from bench.peer_apps import PEERS, available
from bench.publisher import Producer
from bench.report import Report, Row

#: the variants of the publish rounds, with their producer flags (hiredis off unless named)
CELERY_VARIANTS: dict[str, tuple[str, ...]] = {
    "conv": ("--no-hiredis",),
    "raw": ("--no-hiredis",),
    "default": ("--no-hiredis",),
    "conv_orjson": ("--no-hiredis", "--orjson"),
    "conv_hiredis": (),
    "lean": ("--no-hiredis",),
}
#: the Redis keys each variant's publishes leave (emptied between rounds)
KEYS = {
    "dramatiq": ["dramatiq:bench_dramatiq", "dramatiq:bench_dramatiq.msgs"],
    "huey": ["huey.redis.bench_huey"],
    "rq": ["rq:queue:bench_rq"],
}


def run(
    client: Any, n: int, rounds: int, peers: Sequence[str] = tuple(PEERS)
) -> dict[str, list[float]]:
    """Seconds per publish of every variant, round by round."""
    found, _ = available(peers)
    flags = dict(CELERY_VARIANTS) | {peer.name: ("--no-hiredis",) for peer in found}
    if importlib.util.find_spec("orjson") is None:  # the bench extra is not installed
        flags.pop("conv_orjson")
    producers = {name: Producer(name, flag, wait=False) for name, flag in flags.items()}
    try:
        for producer in producers.values():  # started side by side, then warmed up
            producer.wait_ready()
            producer.publish(50)

        def clean() -> None:
            client.delete(*(KEYS.get(name, [f"bench_{name}"])[0] for name in producers))
            extra = [key for name in producers for key in KEYS.get(name, [])[1:]]
            if extra:  # none without the peers (the bench extra)
                client.delete(*extra)

        clean()
        measure = {name: partial(per_publish, producer, n) for name, producer in producers.items()}
        return common.interleave(measure, rounds, on_round=clean)
    finally:
        for producer in producers.values():
            producer.close()


def per_publish(producer: Producer, n: int) -> float:
    return producer.publish(n) / n


def rows(times: dict[str, list[float]], pairs: int) -> list[Row]:
    """Ratios of publish rates (the inverse of the times) from the same rounds."""

    def ratio(faster: str, than: str) -> float:
        return common.median(common.ratios(times[than], times[faster]))

    def us(name: str) -> str:
        return f"{name} {common.median(times[name]) * 1e6:,.0f} us"

    out = [
        Row("publish", "conventions vs raw Celery, same settings (rate ratio)",
            ratio("conv", "raw"), "x", ">= 0.9", f"{us('conv')}, {us('raw')}; {pairs} rounds"),
        Row("publish", "raw Celery defaults vs raw Celery reliable", ratio("default", "raw"), "x",
            note=f"{us('default')}"),
        Row("publish", "conventions + hiredis vs conventions", ratio("conv_hiredis", "conv"), "x",
            note=us("conv_hiredis")),
        Row("publish", "conventions lean (no sent event) vs conventions", ratio("lean", "conv"),
            "x", note=us("lean")),
    ]  # fmt: skip
    if "conv_orjson" in times:  # with the bench extra
        out.insert(2, Row("publish", "conventions + orjson vs conventions",
                          ratio("conv_orjson", "conv"), "x", note=us("conv_orjson")))  # fmt: skip
    for peer in PEERS:
        if peer in times:
            out.append(
                Row("publish", f"{peer} vs raw Celery reliable (rate ratio)", ratio(peer, "raw"),
                    "x", note=us(peer))
            )  # fmt: skip
    return out


def section(report: Report, client: Any, *, n: int, rounds: int) -> None:
    client.flushdb()
    times = run(client, n, rounds)
    for row in rows(times, rounds):
        report.add(row)
    _, skipped = available()
    report.notes += [f"publish: {note}, skipped" for note in skipped]
    client.flushdb()
