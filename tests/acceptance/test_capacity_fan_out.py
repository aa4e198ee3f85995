"""The fan-out recipe through real workers: one child job per tenant, each with its own
idempotency key, so a failing child is retried alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tasks import app
from tests.integration import support_capacity as cap
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

FAILING = ["t07", "t23", "t41"]


def test_fifty_tenants_with_three_failing_run_47_once_and_retry_only_the_3(
    worker_process: Callable[..., Any],
) -> None:
    app.store.put_state("testing:failing:b1", {"tenants": FAILING}, None)
    for name in ("fan1", "fan2"):
        worker_process(name, "email", concurrency=4, include=cap.__name__)
    assert cap.fan_out.delay(batch="b1", tenants=50).get(timeout=60) == 50

    def all_done() -> dict[str, int] | None:
        runs = cap.runs_of("b1")
        done = len(runs) == 51 and all(runs[t] == 2 for t in FAILING)
        return runs if done else None

    runs = wait_for(all_done, timeout=90, every=0.5)
    assert runs.pop("parent") == 1
    assert {t for t, count in runs.items() if count == 2} == set(FAILING)
    assert sorted(t for t, count in runs.items() if count == 1) == sorted(
        f"t{n:02d}" for n in range(50) if f"t{n:02d}" not in FAILING
    )
    # the parent run again (a redelivery, a replay) publishes every child again: the
    # ledger knows each key is done, so no body runs twice
    again = [cap.invoice_tenant.delay(batch="b1", tenant=f"t{n:02d}") for n in range(50)]
    assert [r.get(timeout=60) for r in again] == [None] * 50
    assert sum(cap.runs_of("b1").values()) == 1 + 47 + 2 * 3
