"""A batch callback's key must change with the batch id, whether a template or a
callable gives it (#48): one key for every batch's callback would skip the second
batch's as done for the ledger's seven days."""

from __future__ import annotations

import pytest

from conventions import App, Id, JobContext, Payload
from conventions.errors import ConfigurationError

app = App("callback_keys", set_as_current=False)
app.conf.update(conventions_workloads={"reports": "reports"})


class Done(Payload):
    batch_id: Id
    report: str = "daily"


def _same_for_every_batch(payload: Done) -> str:
    return f"done:{payload.report}"


def _per_batch(payload: Done) -> str:
    return f"done:{payload.batch_id}:{payload.report}"


@app.job("testing.cb_ignores_batch.v1", payload=Done, key=_same_for_every_batch,
         workload="reports")  # fmt: skip
def ignores(payload: Done, ctx: JobContext) -> None: ...  # pragma: no cover (never run)


@app.job("testing.cb_per_batch.v1", payload=Done, key=_per_batch, workload="reports")
def per_batch(payload: Done, ctx: JobContext) -> None: ...  # pragma: no cover (never run)


@pytest.mark.parametrize("batch_id", ["b1", "month-2026-12", "x" * 128, "b_"])
def test_a_callable_key_that_ignores_the_batch_id_is_refused_at_app_batch(batch_id: str) -> None:
    with pytest.raises(ConfigurationError, match=r"whatever the batch id .* must use the payload"):
        app.batch(batch_id, on_complete=ignores.s())


@pytest.mark.parametrize("batch_id", ["b1", "b2", "month-2026-12", "x" * 128, "b_"])
def test_a_callable_key_that_uses_the_batch_id_is_accepted(batch_id: str) -> None:
    batch = app.batch(batch_id, on_success=per_batch.s(report="weekly"))
    assert batch.id == batch_id
