"""The order of a run's states (:mod:`conventions.store.runs`), without a store: the
table every merge follows, and the Lua generated from it."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from conventions.store import redis_runs, runs

AT = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _patch(event: str, attempt: int, minute: int, **detail: Any) -> dict[str, Any]:
    found = runs.patch(event, "billing.charge.v2", "j1", AT + timedelta(minutes=minute),
                       attempt, detail=detail, once={"key": "k1"})  # fmt: skip
    assert found is not None
    return found


def test_every_state_has_a_rank_and_only_the_final_ones_the_final_rank() -> None:
    assert set(runs.RANK) == set(runs.STATES)
    assert {s for s, rank in runs.RANK.items() if rank == runs.FINAL_RANK} == runs.FINAL
    assert max(runs.RANK.values()) == runs.FINAL_RANK


def test_the_lua_rank_table_is_generated_from_the_python_one() -> None:
    for state, rank in runs.RANK.items():
        assert f"{state} = {rank}" in redis_runs.RUN
    assert f"local RUN_FINAL = {runs.FINAL_RANK}" in redis_runs.RUN


def test_only_the_state_and_its_fields_wait_for_the_order() -> None:
    change = _patch("dead_lettered", 1, 2, category="permanent", dead_letter_id="dl-1")
    assert set(change["move"]) <= set(runs.MOVES_WITH_STATE)
    assert not set(change["set"]) & set(runs.MOVES_WITH_STATE)
    assert change["order"] == [runs.FINAL_RANK, 1]


def test_every_order_of_a_runs_events_merges_to_one_record() -> None:
    life = [
        _patch("published", 0, 0),
        _patch("started", 1, 1),
        _patch("retried", 1, 2, exc_type="E", reason="503"),
        _patch("started", 2, 3),
        _patch("succeeded", 2, 4),
    ]
    seen = set()
    for order in itertools.permutations(life):
        doc: dict[str, Any] | None = None
        for change in order:
            doc = runs.merge(doc, change, max_logs=0)
        assert doc is not None
        seen.add(repr(runs.Run.from_doc(doc)))
    (only,) = seen
    assert "state='succeeded'" in only


def test_a_final_state_is_never_left_and_a_lower_rank_never_wins() -> None:
    doc = runs.merge(None, _patch("succeeded", 1, 2), max_logs=0)
    for late in (_patch("skipped_duplicate", 2, 3), _patch("started", 2, 3),
                 _patch("published", 0, 0)):  # fmt: skip
        doc = runs.merge(doc, late, max_logs=0)
    assert (doc["state"], doc["ended_at"], doc["order"]) == (
        "succeeded", runs.posix(AT + timedelta(minutes=2)), [runs.FINAL_RANK, 1],
    )  # fmt: skip
    running = runs.merge(None, _patch("started", 1, 1), max_logs=0)
    deferred = runs.merge(running, _patch("deferred", 1, 2, reason="resume"), max_logs=0)
    again = runs.merge(deferred, _patch("started", 1, 3), max_logs=0)
    assert (deferred["state"], again["state"]) == ("deferred", "running")  # same attempt
