"""Times, on the Redis server's clock, how long a killed worker's messages take to come
back: the ones it had claimed (in flight, in kombu's unacked set) and the ones its fetch
had moved into its inboxes, each seen and timed apart.

Call :meth:`OrphanWatch.killed` with the worker's main pid *just before* the kill: it
notes the Redis clock, the unacked scores and the entries of that worker's inboxes
(its consumers are found by the ``pid`` of their description). A claimed message whose
score is not renewed for one beat period after the kill is an orphan of that kill; it is
back once it left the unacked set or was claimed again (a new score). An inbox entry is
back once it left the dead consumer's inbox (only a sweep's give-back moves it).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis

from conventions.transport.layout import CONSUMER, INBOX, INBOXES, server_now


@dataclass(eq=False)
class Kill:
    #: the Redis clock at the kill
    at: float
    scores: dict[bytes, float]
    #: (inbox, entry) pairs the dead consumer's inboxes held
    inboxes: list[tuple[bytes, bytes]]
    #: the caller's name for the kill (the worker's clock, say)
    label: str = ""


class OrphanWatch:
    """See the module. ``waits``: ``(kind, seconds, label)`` per orphan back, kind
    ``in-flight`` or ``inbox``, label the kill's; :meth:`never_back`: orphans not seen
    back (yet)."""

    def __init__(self, url: str, period: float) -> None:
        self.client = redis.Redis.from_url(url)
        self.period = period
        self.waits: list[tuple[str, float, str]] = []
        self.kills: list[Kill] = []
        self.in_flight: dict[bytes, tuple[Kill, float]] = {}
        self.inbox: dict[tuple[bytes, bytes], Kill] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def killed(self, pid: int, label: str = "", at: float | None = None) -> Kill:
        """Note what the worker of main process ``pid`` holds, just before its kill;
        ``at``: the Redis clock its death is timed from (default now: a worker stopped
        earlier with SIGSTOP died when it stopped)."""
        client = self.client
        scores = dict(client.zrange("unacked_index", 0, -1, withscores=True))
        mine = []
        for key in client.scan_iter(CONSUMER.format(consumer="*")):
            if client.hget(key, "pid") == str(pid).encode():
                mine.append(key.decode().removeprefix(CONSUMER.format(consumer="")))
        entries = []
        for inbox in client.hkeys(INBOXES):
            if any(inbox.decode().startswith(INBOX.format(consumer=c, source="")) for c in mine):
                entries += [(inbox, entry) for entry in client.lrange(inbox, 0, -1)]
        kill = Kill(server_now(client) if at is None else at, scores, entries, label)
        with self._lock:
            self.kills.append(kill)
            for pair in entries:
                self.inbox[pair] = kill
        return kill

    def _run(self) -> None:
        pending: list[Kill] = []
        while not self.stopping.wait(0.1):
            try:
                self._poll(pending)
            except redis.RedisError:
                continue

    def _poll(self, pending: list[Kill]) -> None:
        client = self.client
        scores = dict(client.zrange("unacked_index", 0, -1, withscores=True))
        now = server_now(client)
        with self._lock:
            pending.extend(k for k in self.kills if k not in pending and not _done(k))
            for kill in list(pending):
                if now - kill.at < self.period + 1:
                    continue
                kill.scores, done = {}, dict(kill.scores)  # examined once
                pending.remove(kill)
                for tag, score in done.items():
                    if scores.get(tag) == score:  # not renewed: its consumer is dead
                        self.in_flight.setdefault(tag, (kill, score))
            for tag, (owner, score) in list(self.in_flight.items()):
                if scores.get(tag) != score:
                    self.waits.append(("in-flight", now - owner.at, owner.label))
                    del self.in_flight[tag]
            for (inbox, entry), owner in list(self.inbox.items()):
                if entry not in client.lrange(inbox, 0, -1):
                    self.waits.append(("inbox", now - owner.at, owner.label))
                    del self.inbox[(inbox, entry)]

    def worst(self, kind: str | None = None, label: str | None = None) -> float | None:
        found = [w for k, w, n in self.waits if kind in (None, k) and label in (None, n)]
        return max(found) if found else None

    def count(self, kind: str) -> int:
        return len([1 for k, _, _ in self.waits if k == kind])

    def never_back(self) -> int:
        with self._lock:
            return len(self.in_flight) + len(self.inbox)

    def settle(self, timeout: float) -> None:
        """Wait (bounded) until every kill was examined and every orphan is back."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                examined = all(not k.scores for k in self.kills)
            if examined and not self.never_back():
                return
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.client.close()


def _done(kill: Kill) -> bool:
    return not kill.scores
