"""Run history: one record per job (a run, by task id), kept beside its audit trail.

A run is never written on its own: each audit event carries a small *patch* of its run
(:func:`patch`) and the store applies it in the same script (Redis) or transaction (SQL)
as the event itself, so run history adds no round trip to a job. The patch says which
fields to set, which to set only when still empty, and which attempt to open or close;
:func:`merge` applies one (the SQL store's and the tests' form; the Redis store runs the
same rules in Lua, :mod:`conventions.store.redis_runs`, generated from the tables here
and checked against :func:`merge` by a test).

Events do not arrive in order: on the two-step publish (the push, then ``published``) a
fast worker's ``started`` and ``succeeded`` can land first, and a retry is pushed before
its ``retried`` is written. So a run's states are ordered: each change carries its
*order*, ``[rank of its state, attempt]`` (:data:`RANK`), and the state and the fields
that go with it (:data:`MOVES_WITH_STATE`) move only when that order is not below the
record's. A final state (rank :data:`FINAL_RANK`) is never left; within a rank the newer
attempt wins, and the same attempt goes to the later writer (a deferral, then its start
again). ``created_at`` keeps the earliest time seen, ``updated_at`` the latest.

A record is bounded: :data:`MAX_ATTEMPTS` attempts (the first and the newest), errors of
:data:`MAX_ERROR` characters, and the run's log lines (opted in per job) capped by the
store's ``runs_max_logs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conventions.config import formats

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

#: a state's rank: a run never moves to a state of a lower rank (a late ``published``
#: cannot undo ``running``), nor leaves a final one; within a rank the newer attempt wins
RANK: dict[str, int] = {
    "queued": 0, "delayed": 0,
    "running": 1, "retrying": 1, "deferred": 1,
    "succeeded": 2, "skipped": 2, "dead_lettered": 2,
}  # fmt: skip
#: the rank of the final states (absorbing)
FINAL_RANK = 2
#: the fields that move only with the state (a change ranked below the record's leaves them)
MOVES_WITH_STATE = ("state", "ended_at", "due", "category", "dead_letter_id")
#: the time fields merged by their value, not their arrival: the earliest and the latest
EARLIEST = ("created_at",)
LATEST = ("updated_at",)

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
    sets: dict[str, Any] = {"task": task}
    if formats.RECORDS != 1:  # nothing at version 1: an older writer's merge keeps it
        sets[formats.RECORD_FIELD] = formats.RECORDS
    if event == "published" and detail.get("due"):  # a countdown or eta: it waits first
        state = "delayed"
        sets["due"] = str(detail["due"])
    if state is not None:
        sets["state"] = state
    first = {name: value for name, value in once.items() if value not in (None, "")}
    if event == "dead_lettered":
        sets["category"] = detail.get("category")
        sets["dead_letter_id"] = detail.get("dead_letter_id")
    if event == "replayed":  # this run replays a dead letter: who, and of which job
        sets["replayed_by"] = detail.get("actor")
        sets["replay_of"] = detail.get("replay_of_task_id")
    if state in FINAL:
        sets["ended_at"] = when
    moving = {name: sets.pop(name) for name in MOVES_WITH_STATE if name in sets}
    data: dict[str, Any] = {
        "id": task_id, "set": sets, "once": first,
        "earliest": dict.fromkeys(EARLIEST, when), "latest": dict.fromkeys(LATEST, when),
    }  # fmt: skip
    if state is not None:
        data["move"] = moving
        data["order"] = [RANK[state], 0 if event == "published" else attempt]
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
    if moves(merged, change.get("order")):
        merged.update(change.get("move", {}))
        merged["order"] = list(change["order"])
    merged.update(change.get("set", {}))
    for name, value in change.get("once", {}).items():
        if merged.get(name) in (None, ""):
            merged[name] = value
    for name, value in change.get("earliest", {}).items():
        if not isinstance(merged.get(name), int | float) or value < merged[name]:
            merged[name] = value
    for name, value in change.get("latest", {}).items():
        if not isinstance(merged.get(name), int | float) or value > merged[name]:
            merged[name] = value
    attempts = [dict(item) for item in _list(merged.get("attempts"))]
    step = change.get("attempt")
    if step is not None:
        found = next((item for item in reversed(attempts) if item.get("n") == step["n"]), None)
        if found is None:  # in attempt order, whatever order the events came in
            at = next((i for i, item in enumerate(attempts) if item.get("n", 0) > step["n"]), None)
            attempts.insert(len(attempts) if at is None else at, dict(step))
        else:
            found.update(step)
        if len(attempts) > MAX_ATTEMPTS:
            attempts = [attempts[0], *attempts[-(MAX_ATTEMPTS - 1) :]]
    merged["attempts"] = attempts
    lines = [*_list(merged.get("logs")), *change.get("logs", [])]
    merged["logs"] = lines[-max_logs:] if max_logs > 0 else []
    return merged


def order_of(doc: Mapping[str, Any]) -> list[int] | None:
    """A record's order: the one its last state move wrote, else its state's rank (a
    record written before runs had an order), else None (no state yet)."""
    held = doc.get("order")
    if isinstance(held, list) and len(held) == 2:
        return [int(held[0]), int(held[1])]
    rank = RANK.get(str(doc.get("state")))
    return None if rank is None else [rank, 0]


def moves(doc: Mapping[str, Any], order: Any) -> bool:
    """Whether a change of ``order`` moves ``doc``'s state: it has one, the record is
    not final, and it is not below the record's order."""
    if not isinstance(order, list | tuple):
        return False
    held = order_of(doc)
    if held is None:
        return True
    if held[0] >= FINAL_RANK:
        return False
    return (int(order[0]), int(order[1])) >= (held[0], held[1])


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
        """A run record from its JSON form (``NewerFormat`` when a newer release wrote
        it: its ``v``, absent at version 1, set by every writer's patch)."""
        formats.check_record(doc, "run record")
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
