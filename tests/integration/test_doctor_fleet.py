"""The doctor's fleet check (:mod:`conventions.ops.doctor_fleet`) on real workers: two
``celery worker`` processes of the reference app on the layer's Redis transport, one
with the app's ``recovery_timeout`` (30 s) and one started with 12 s. The doctor reads
each live consumer's setting back from its liveness score and names both."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from conventions.ops import doctor_fleet, doctor_live
from tests.fixtures import WorkerProcess

pytestmark = [pytest.mark.usefixtures("services"), pytest.mark.timeout(120)]


def fleet(app: Any) -> list[Any]:
    live = doctor_live.observe(app, timeout=2.0)
    return [f for f in doctor_live.live_checks(app, live) if f.code == doctor_fleet.CODE]


def test_the_doctor_names_the_workers_whose_recovery_timeout_differs(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    from tasks import app

    agreed = worker_process("fleet-a", queues="email,heavy")
    assert fleet(app) == [], "a fleet that agrees with the app is not reported"

    odd = worker_process("fleet-b", queues="email,heavy", CONVENTIONS_RECOVERY_TIMEOUT="12")
    [found] = fleet(app)

    assert found.level == "warning"
    # the value read back: 12 s, or an interval that ends there (a fetch's sign of life
    # since its last beat)
    assert re.search(rf":{odd.proc.pid} (\d+-)?12s", found.message), found.message
    assert f":{agreed.proc.pid} " in found.message
    assert "this app: 30s" in found.message


def test_bounds_read_back_from_a_score_admit_only_the_setting_it_was_written_with() -> None:
    beat = doctor_fleet.Bound("c", "h", "1", low=26.0, high=30.0)

    assert beat.admits(30.0) and beat.admits(27.5)
    assert not beat.admits(12.0) and not beat.admits(36.0)
    assert not beat.overlaps(doctor_fleet.Bound("d", "h", "2", low=9.0, high=12.0))
