"""The weighted order of a fetch over priority steps (``conventions.transport.priorities``):
the bound on how long the lowest step waits, checked on the order itself."""

from __future__ import annotations

import pytest

from conventions.transport import priorities


@pytest.mark.parametrize("steps", [[0, 3, 6], [0, 3, 6, 9], [0, 9]])
def test_in_any_window_of_one_cycle_each_step_comes_first_its_weighted_share(
    steps: list[int],
) -> None:
    length = 2 ** len(steps) - 1
    firsts = [priorities.fetch_order(steps, turn)[0] for turn in range(5 * length)]
    for start in range(len(firsts) - length + 1):
        window = firsts[start : start + length]
        assert [window.count(s) for s in steps] == list(priorities.weights(len(steps)))


@pytest.mark.parametrize("turn", range(15))
def test_every_fetch_still_looks_at_every_step_highest_first_after_its_pick(turn: int) -> None:
    order = priorities.fetch_order([6, 0, 9, 3], turn)
    assert sorted(order) == [0, 3, 6, 9]
    assert order[1:] == sorted(order[1:])


def test_the_first_fetch_looks_at_the_highest_step_first() -> None:
    assert priorities.fetch_order([0, 3, 6], 0) == [0, 3, 6]


def test_one_step_keeps_the_plain_order() -> None:
    assert {tuple(priorities.fetch_order([0], turn)) for turn in range(10)} == {(0,)}
