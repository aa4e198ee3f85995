"""A 429 from a dependency pauses its limiter for every job, for its Retry-After."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tasks import app
from tests.integration import support_capacity as cap

pytestmark = pytest.mark.usefixtures("clean_store")


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[cap.Provider]:
    server = cap.Provider(18350, quota=100)
    monkeypatch.setenv("CAPACITY_PROVIDER_URL", server.url)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_429_with_retry_after_holds_every_job_of_the_dependency_back(
    thread_worker: Any, provider: cap.Provider
) -> None:
    provider.refuse_next, provider.retry_after = 1, 3
    first = cap.rated_call.delay(call_id="first")
    limiter = app.conventions_settings.limits["testing_rate"]
    assert _wait_for_arrivals(provider, 1)
    refused_at = provider.arrivals[0]
    others = [cap.rated_call.delay(call_id=f"other{n}") for n in range(3)]
    assert first.get(timeout=30) == 200
    assert all(r.get(timeout=30) == 200 for r in others)
    assert provider.statuses == [429, 200, 200, 200, 200]
    later = [t - refused_at for t in provider.arrivals[1:]]
    print(f"\ncalls after the 429 came {[round(t, 2) for t in later]}s later")
    assert min(later) >= 3.0 - 0.1  # nobody called before the Retry-After ran out
    assert limiter.bucket == "limit:testing_rate"


def _wait_for_arrivals(provider: cap.Provider, count: int) -> bool:
    import time

    deadline = time.monotonic() + 20
    while len(provider.arrivals) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
