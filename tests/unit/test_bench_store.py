"""``bench.store_instructions``'s table: per configuration and step, and each against the
full profile, from the result file's numbers (the docs' table is made by it)."""

from __future__ import annotations

from typing import Any

from bench import store_instructions, tables_scale


def _step(instructions: float, commands: float) -> dict[str, Any]:
    return {"instructions": instructions, "commands": commands, "by_command": {}}


def test_the_table_shows_each_configuration_against_the_full_profile() -> None:
    data = {
        "command": "python -m bench.store_instructions", "commit": "0123456789abcdef",
        "date": "2026-12-06T18:00:00Z", "cores": 2, "python": "3.11",
        "load": {"start": [0.1, 0.1, 0.1], "end": [0.1, 0.1, 0.1], "quiet": True},
        "jobs": 300,
        "configs": {
            "full": {"publish": _step(400e3, 19), "claim": _step(500e3, 25),
                     "complete": _step(600e3, 20)},
            "no_runs": {"publish": _step(200e3, 12), "claim": _step(350e3, 22),
                        "complete": _step(350e3, 17)},
        },
    }  # fmt: skip
    lines = tables_scale.store_instructions(data)
    assert lines[0].startswith("_`python -m bench.store_instructions` at commit `0123456789`")
    assert "300 jobs" in lines[0]
    assert lines[4] == (
        "| as profiled (audit events and run history) | 400,000 | 500,000 | 600,000 "
        "| 1,500,000 | 1.00x | 19 + 25 + 20 = 64 |"
    )
    assert "| 900,000 | 0.60x | 12 + 22 + 17 = 51 |" in lines[5]


def test_the_configurations_are_the_tables_and_each_says_what_it_records() -> None:
    assert set(store_instructions.CONFIGS) == set(tables_scale.STORE_CONFIGS)
    assert store_instructions.CONFIGS["full"] == (True, True)
    assert store_instructions.CONFIGS["neither"] == (False, False)
