"""Run history: one record per job (a run, by task id), kept beside its audit trail.

A run is never written on its own: each audit event carries a small *patch* of its run
(:func:`patch`) and the store applies it in the same script (Redis) or transaction (SQL)
as the event itself, so run history adds no round trip to a job. The patch says which
fields to set, which to set only when still empty, and which attempt to open or close;
:func:`merge` applies one (the SQL store's and the tests' form; the Redis store runs the
same rules in Lua, :mod:`conventions.store.redis_runs`).

A record is bounded: :data:`MAX_ATTEMPTS` attempts (the first and the newest), errors of
:data:`MAX_ERROR` characters, and the run's log lines (opted in per job) capped by the
store's ``runs_max_logs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: the states of a run, in the order a run usually passes them
STATES = (
    "queued", "delayed", "running", "retrying", "succeeded", "skipped", "deferred",
    "dead_lettered",
)  # fmt: skip
#: the states a run ends in (the others are live)
FINAL = frozenset({"succeeded", "skipped", "dead_lettered"})
#: the attempts a record keeps: the first, and the newest ones
MAX_ATTEMPTS = 20
#: characters of an error (scrubbed) a record keeps
MAX_ERROR = 500
#: characters of a log line a record keeps
MAX_LINE = 500
#: the fields a run is found by, besides time (``list_runs`` filters)
FILTERS = ("task", "state", "key", "correlation_id", "queue")

#: audit event -> (state the run moves to or None, the attempt's outcome or None)
_MOVES: dict[str, tuple[str | None, str | None]] = {
    "published": ("queued", None),
    "started": ("running", None),
    "retried": ("retrying", "retried"),
    "retry_failed": (None, None),
    "deferred": ("deferred", "deferred"),
    "succeeded": ("succeeded", "succeeded"),
    "skipped_duplicate": ("skipped", "skipped"),
    "dead_lettered": ("dead_lettered", "dead_lettered"),
    "quarantined": (None, None),
    "replayed": (None, None),
}


def posix(moment: datetime) -> float:
    """POSIX seconds (naive times are UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp(), 6)


def _moment(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), UTC)


def patch(
    event: str,
    task: str,
    task_id: str,
    at: datetime,
    attempt: int,
    *,
    detail: Mapping[str, Any],
    once: Mapping[str, Any],
    worker: str | None = None,
    error: str | None = None,
    logs: list[str] | None = None,
) -> dict[str, Any] | None:
    """The run patch an audit event carries, or None when the event is no step of a run.

    ``once``: the run's fields taken from its first event (key, correlation, causation,
    actor, queue); ``error``: already scrubbed; ``logs``: the run's lines since the last
    event that carried them.
    """
    move = _MOVES.get(event)
    if move is None:
        return None
    state, outcome = move
    when = posix(at)
    sets: dict[str, Any] = {"updated_at": when, "task": task}
    if event == "published" and detail.get("due"):  # a countdown or eta: it waits first
        state = "delayed"
        sets["due"] = str(detail["due"])
    if state is not None:
        sets["state"] = state
    first = {name: value for name, value in once.items() if value not in (None, "")}
    first["created_at"] = when
    if event == "dead_lettered":
        sets["category"] = detail.get("category")
        sets["dead_letter_id"] = detail.get("dead_letter_id")
    if event == "replayed":  # this run replays a dead letter: who, and of which job
        sets["replayed_by"] = detail.get("actor")
        sets["replay_of"] = detail.get("replay_of_task_id")
    if state in FINAL:
        sets["ended_at"] = when
    data: dict[str, Any] = {"id": task_id, "set": sets, "once": first}
    if attempt and event not in ("published", "replayed"):
        step: dict[str, Any] = {"n": attempt}
        if event == "started":
            step["started_at"] = when
            if worker:
                step["worker"] = worker
        if outcome is not None:
            step["ended_at"] = when
            step["outcome"] = outcome
        if error:
            step["error"] = error[:MAX_ERROR]
        data["attempt"] = step
    if logs:
        data["logs"] = [line[:MAX_LINE] for line in logs]
    return data


def merge(
    doc: Mapping[str, Any] | None, change: Mapping[str, Any], *, max_logs: int
) -> dict[str, Any]:
    """``doc`` (a run record's JSON form, or None) with ``change`` (a :func:`patch`)
    applied: the rules the Redis script follows too."""
    merged: dict[str, Any] = dict(doc or {"id": change["id"]})
    merged.update(change.get("set", {}))
    for name, value in change.get("once", {}).items():
        if merged.get(name) in (None, ""):
            merged[name] = value
    attempts = [dict(item) for item in _list(merged.get("attempts"))]
    step = change.get("attempt")
    if step is not None:
        found = next((item for item in reversed(attempts) if item.get("n") == step["n"]), None)
        if found is None:
            attempts.append(dict(step))
        else:
            found.update(step)
        if len(attempts) > MAX_ATTEMPTS:
            attempts = [attempts[0], *attempts[-(MAX_ATTEMPTS - 1) :]]
    merged["attempts"] = attempts
    lines = [*_list(merged.get("logs")), *change.get("logs", [])]
    merged["logs"] = lines[-max_logs:] if max_logs > 0 else []
    return merged


def _list(value: Any) -> list[Any]:
    """A JSON list (Lua's cjson writes an empty one as ``{}``)."""
    return list(value) if isinstance(value, list) else []


@dataclass(frozen=True)
class Attempt:
    """One delivery that ran (or was judged) of a run."""

    n: int
    worker: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "worker": self.worker,
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "outcome": self.outcome,
            "error": self.error,
        }


@dataclass(frozen=True)
class Run:
    """A job's run record (``conventions runs show``)."""

    id: str
    task: str
    state: str
    created_at: datetime
    updated_at: datetime
    key: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    actor: str | None = None
    queue: str | None = None
    ended_at: datetime | None = None
    category: str | None = None
    dead_letter_id: str | None = None
    #: who replayed a dead letter as this run, and the task id of the job it replays
    replayed_by: str | None = None
    replay_of: str | None = None
    attempts: tuple[Attempt, ...] = ()
    logs: tuple[str, ...] = field(default=(), repr=False)

    @property
    def version(self) -> str:
        """The task's version, the last part of its name (``email.send.v2`` -> ``v2``)."""
        return self.task.rpartition(".")[2]

    @property
    def worker(self) -> str | None:
        """The worker of the newest attempt."""
        return self.attempts[-1].worker if self.attempts else None

    @property
    def live(self) -> bool:
        return self.state not in FINAL

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Run:
        created = _moment(doc.get("created_at")) or datetime.now(UTC)
        return cls(
            id=str(doc["id"]),
            task=str(doc.get("task") or ""),
            state=str(doc.get("state") or "queued"),
            created_at=created,
            updated_at=_moment(doc.get("updated_at")) or created,
            key=doc.get("key"),
            correlation_id=doc.get("correlation_id"),
            causation_id=doc.get("causation_id"),
            actor=doc.get("actor"),
            queue=doc.get("queue"),
            ended_at=_moment(doc.get("ended_at")),
            category=doc.get("category"),
            dead_letter_id=doc.get("dead_letter_id"),
            replayed_by=doc.get("replayed_by"),
            replay_of=doc.get("replay_of"),
            attempts=tuple(
                Attempt(
                    n=int(item.get("n") or 0),
                    worker=item.get("worker"),
                    started_at=_moment(item.get("started_at")),
                    ended_at=_moment(item.get("ended_at")),
                    outcome=item.get("outcome"),
                    error=item.get("error"),
                )
                for item in _list(doc.get("attempts"))
            ),
            logs=tuple(str(line) for line in _list(doc.get("logs"))),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task": self.task,
            "version": self.version,
            "state": self.state,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "ended_at": _iso(self.ended_at),
            "key": self.key,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "actor": self.actor,
            "queue": self.queue,
            "category": self.category,
            "dead_letter_id": self.dead_letter_id,
            "replayed_by": self.replayed_by,
            "replay_of": self.replay_of,
            "attempts": [attempt.to_dict() for attempt in self.attempts],
            "logs": list(self.logs),
        }


def matches(doc: Mapping[str, Any], filters: Mapping[str, str | None]) -> bool:
    """Whether a run record passes every filter given (None: any)."""
    return all(value is None or doc.get(name) == value for name, value in filters.items())


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
