"""A job that cannot take every slot it needs gives back the ones it took, and the lease
keeper stops renewing them: a refused admission never shrinks a fleet-wide cap.

Real Redis, a real (in-process) worker. The second acquisition fails for real: its cap is
full (held by another owner), or Redis refuses the command (its slot key holds a list, so
the script's ``GET`` gets ``WRONGTYPE``, an error raised between the two acquisitions).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from conventions import Id, JobContext, Payload
from conventions.capacity.leases import keeper
from conventions.store import keys
from tasks import app
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

#: two caps, leased long enough that the keeper would not renew (and drop) a leaked slot
#: during the test: what the keeper holds right after a refusal is what it would keep
LIMITS = {
    "leak_first": {"concurrency": 1, "lease": 30},
    "leak_second": {"concurrency": 1, "lease": 30},
}
app.conf.update(conventions_limits={**(app.conf.get("conventions_limits") or {}), **LIMITS})
app.__dict__.pop("conventions_settings", None)  # read again with these limits

FIRST, SECOND = "limit:leak_first:0", "limit:leak_second:0"


class Call(Payload):
    call_id: Id


@app.job(
    "testing.two_caps.v1", payload=Call, key="two_caps:{call_id}", workload="email",
    uses=("leak_first", "leak_second"),
)  # fmt: skip
def two_caps(payload: Call, ctx: JobContext) -> str:
    return payload.call_id


@pytest.fixture
def short_store_defer() -> Iterator[None]:
    """A store-down deferral comes back after half a lease or more: 1-2 s here."""
    settings = app.conventions_settings
    app.__dict__["conventions_settings"] = dataclasses.replace(settings, lease=2.0)
    yield
    app.__dict__["conventions_settings"] = settings


def _kept(name: str) -> list[tuple[str, str, str]]:
    """The keeper's entries for the lease ``name`` (any owner)."""
    with keeper._lock:
        return [item for item in keeper._leases if item[:2] == ("lease", name)]


def _deferred(caplog: pytest.LogCaptureFixture, task_id: str) -> bool:
    return any(
        f"[{task_id}]: deferred" in r.getMessage()
        for r in caplog.records
        if r.name == "conventions.worker.delivery"
    )


def test_a_job_refused_at_its_second_cap_frees_its_first_slot_and_the_keeper_forgets_it(
    thread_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conventions.worker.delivery")
    store = app.store
    assert store.acquire(SECOND, "someone-else", 30) is None  # the second cap is full
    result = two_caps.delay(call_id="full")

    wait_for(lambda: _deferred(caplog, result.id), timeout=20, every=0.01)
    assert store.lease_holder(FIRST) is None
    assert _kept(FIRST) == []  # else it is renewed until it reports "lease lost"

    store.release_lease(SECOND, "someone-else")
    assert result.get(timeout=30) == "full"
    assert (store.lease_holder(FIRST), store.lease_holder(SECOND)) == (None, None)
    assert _kept(FIRST) == _kept(SECOND) == []
    lost = [r for r in caplog.records if "lost by" in r.getMessage()]
    assert lost == []


def test_a_store_error_at_the_second_cap_frees_the_first_slot_and_nothing_renews_it(
    thread_worker: Any, caplog: pytest.LogCaptureFixture, short_store_defer: None
) -> None:
    caplog.set_level(logging.INFO, logger="conventions.worker.delivery")
    store = app.store
    broken = keys.lease(SECOND, store.prefix)  # type: ignore[attr-defined]
    store.client.rpush(broken, "not a lease")  # type: ignore[attr-defined]
    result = two_caps.delay(call_id="error")

    wait_for(lambda: _deferred(caplog, result.id), timeout=20, every=0.01)
    assert store.lease_holder(FIRST) is None  # given back at once, not after its lease
    assert _kept(FIRST) == []  # else the keeper renews it for the life of the worker

    store.client.delete(broken)  # type: ignore[attr-defined]
    assert result.get(timeout=30) == "error"
    assert (store.lease_holder(FIRST), store.lease_holder(SECOND)) == (None, None)
    assert _kept(FIRST) == _kept(SECOND) == []
