"""A long job during a deploy: it stops at a checkpoint, the next delivery resumes there."""

from __future__ import annotations

from conventions.testing import JobKit

from tasks.imports import FEEDS, IMPORTED, import_feed


def test_a_deploy_stops_the_import_at_a_checkpoint_and_it_resumes_there(cc_kit: JobKit) -> None:
    FEEDS["feed_1"] = ["row a", "row b", "row c"]

    with cc_kit.stopping():  # the worker received its warm shutdown
        first = cc_kit.run(import_feed, feed_id="feed_1")

    assert first.outcome == "deferred"  # published again, no attempt spent
    assert IMPORTED == ["row a"]
    assert cc_kit.checkpoint("import:feed_1") == {"row": 1}

    (second,) = cc_kit.drain()

    assert second.outcome == "succeeded"
    assert second.attempt == 1
    assert IMPORTED == ["row a", "row b", "row c"]  # each row once
    assert cc_kit.checkpoint("import:feed_1") is None  # cleared once done
    assert (cc_kit.progress(second) or {})["done"] == 3
