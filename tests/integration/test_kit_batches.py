"""The test kit runs a batch to completion on its virtual clock: members (a retried one
waits its backoff on the clock, not in real time), the dead letter, the callback the
batch's end publishes, and a replay that fires ``on_success``."""

from __future__ import annotations

import time
from pathlib import Path

from conventions import App, Id, JobContext, Payload, PermanentError, TransientError
from conventions.config import profile
from conventions.ops.replay import replay
from conventions.testing import JobKit


class Item(Payload):
    item_id: Id


class Done(Payload):
    batch_id: Id


def _kit_app() -> App:
    """An app of its own, configured for servers the kit never reaches."""
    app = App("kit_batches", set_as_current=False)
    unreachable = "redis://127.0.0.1:1"
    app.conf.update(
        profile.reliable(
            broker_url=f"{unreachable}/0", store_url=f"{unreachable}/1",
            result_backend=f"{unreachable}/1",
        ),
        conventions_workloads={"default": "kit"},
    )  # fmt: skip

    @app.job("kit.batch_item.v1", payload=Item, key="item:{item_id}", workload="default")
    def item(payload: Item, ctx: JobContext) -> str:
        if payload.item_id == "flaky" and ctx.attempt < 3:
            raise TransientError("the provider is down")
        if payload.item_id == "bad" and app.store.get_state("fixed") is None:
            raise PermanentError("bad item")
        return "ok"

    def record(which: str, payload: Done) -> str:
        status = app.store.get_batch(payload.batch_id)
        assert status is not None and status.pending == 0
        app.store.put_state(f"ran:{which}:{status.succeeded}:{status.failed}", {}, None)
        return which

    @app.job("kit.batch_success.v1", payload=Done, key="success:{batch_id}", workload="default")
    def on_success(payload: Done, ctx: JobContext) -> str:
        return record("on_success", payload)

    @app.job("kit.batch_complete.v1", payload=Done, key="complete:{batch_id}", workload="default")
    def on_complete(payload: Done, ctx: JobContext) -> str:
        return record("on_complete", payload)

    return app


def test_the_kit_runs_a_batch_to_completion_on_its_virtual_clock(tmp_path: Path) -> None:
    app = _kit_app()
    item, on_success, on_complete = (
        app.tasks[name] for name in ("kit.batch_item.v1", "kit.batch_success.v1",
                                     "kit.batch_complete.v1")
    )  # fmt: skip
    with JobKit.open(app, store_url=f"sqlite:///{tmp_path / 'store.db'}") as kit:
        batch = app.batch("month", on_success=on_success.s(), on_complete=on_complete.s())
        for item_id in ("a", "b", "flaky", "bad"):
            batch.add(item, item_id=item_id)
        clock_before, real_before = kit.clock.now(), time.monotonic()
        status = kit.run_batch(batch)

        assert (status.pending, status.succeeded, status.failed) == (0, 3, 1)
        assert status.callback_states == {"on_complete": "sent", "on_success": "waiting"}
        assert app.store.get_state("ran:on_complete:3:1") is not None
        # the flaky member's two backoffs passed on the clock, not in real time
        assert kit.clock.now() > clock_before and time.monotonic() - real_before < 30

        app.store.put_state("fixed", {}, None)
        (dead,) = status.dead_letter_ids
        replay(app, dead, reason="fixed", actor="test")
        kit.drain()
        after = app.store.get_batch("month")
        assert after is not None and (after.succeeded, after.failed) == (4, 0)
        assert after.callback_states == {"on_complete": "sent", "on_success": "sent"}
        assert app.store.get_state("ran:on_success:4:0") is not None
