"""What the demo watches while it runs: the shop, the store, the outbox and the queues.

Progress lines go through :meth:`Observer.say` (seconds since the start first). On Redis a
sampler thread reads every queue's depth and oldest waiting job
(:mod:`conventions.observability.queues`, the same reader as ``conventions queues``) four times a
second and keeps the peaks: the figure no Celery tool shows.
"""

from __future__ import annotations

import threading
import time
from typing import Any

SAMPLE_EVERY = 0.25  #: seconds between two queue reads


class Observer:
    """Reads the demo's state; on Redis or RabbitMQ, samples the queues in the background."""

    def __init__(self, observable: bool, started: float) -> None:
        from tasks import app

        self.app, self.started = app, started
        self.peaks: dict[str, dict[str, float]] = {}
        self.latest: dict[str, Any] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if observable:
            self._thread = threading.Thread(target=self._sample, name="queues", daemon=True)
            self._thread.start()

    def say(self, message: str) -> None:
        print(f"demo: [{time.monotonic() - self.started:5.1f}s] {message}", flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _sample(self) -> None:
        from conventions.observability import queues

        with queues.from_app(self.app) as reader:
            while not self._stop.wait(SAMPLE_EVERY):
                try:
                    states = reader.read()
                except Exception:  # a read that fails is a missing sample, not a failure
                    continue
                self.samples += 1
                for state in states:
                    self.latest[state.queue] = state
                    peak = self.peaks.setdefault(state.queue, {"depth": 0, "oldest_age": 0.0})
                    peak["depth"] = max(peak["depth"], state.depth)
                    peak["oldest_age"] = max(peak["oldest_age"], state.oldest_age or 0.0)

    def queue_line(self) -> str:
        """``; queues: email 3 waiting (oldest 0.4s), heavy empty`` (the oldest's age is
        ``?`` on RabbitMQ, which does not tell it)."""
        if not self.latest:
            return ""
        parts = []
        for name, state in sorted(self.latest.items()):
            if state.depth and state.oldest_age is None:
                parts.append(f"{name} {state.depth} waiting (oldest ?)")
            elif state.depth:
                parts.append(f"{name} {state.depth} waiting (oldest {state.oldest_age:.1f}s)")
            else:
                parts.append(f"{name} empty")
        return "; queues: " + ", ".join(parts)

    def snapshot(self) -> dict[str, Any]:
        """Receipts sent, dead letters kept, retries and ledger skips so far, outbox rows
        not published."""
        from conventions.store import counts
        from conventions.transactional import outbox
        from tasks import db, shop

        with db.transaction() as session:
            receipts = shop.count_rows(session, shop.SentEmail)
        events = counts.events(self.app.store.counters())
        return {
            "receipts": receipts,
            "dead_letters": self.app.store.count_dead_letters(),
            "retried": sum(n for (name, _), n in events.items() if name == "retried"),
            "skipped": sum(n for (name, _), n in events.items() if name == "skipped_duplicate"),
            "outbox": outbox.status(db.engine()).pending,
        }

    def audit(self, correlation_ids: list[str]) -> list[Any]:
        """Every audit event of these stories, oldest first."""
        found = [e for cid in correlation_ids for e in self.app.store.audit_for(cid)]
        return sorted(found, key=lambda event: event.at)
