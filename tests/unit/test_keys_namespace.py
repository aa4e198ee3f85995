"""Idempotency keys: namespaced by task, refused when empty or oversized (no broker)."""

from __future__ import annotations

import pytest

from conventions import App, ConfigurationError, Id, JobContext, Payload, PayloadError
from conventions.store import keys

app = App("keys-unit", set_as_current=False)
app.conf.conventions_workloads = {"email": "email"}


class Call(Payload):
    call_id: Id
    note: str = ""
    repeat: int = 1


@app.job("unit.keyed.v1", payload=Call, key=lambda p: p.note * p.repeat, workload="email")
def keyed(payload: Call, ctx: JobContext) -> None:
    """Its key is ``note`` repeated: empty or huge on purpose."""


@app.job("unit.fixed.v1", payload=Call, key="fixed:{call_id}", workload="email")
def fixed(payload: Call, ctx: JobContext) -> None:
    """A template key, no override allowed."""


def test_the_namespace_is_the_task_name_without_its_version() -> None:
    assert keys.namespace("payments.apply_event.v1") == "payments.apply_event"
    assert keys.namespace("payments.apply_event.v12") == "payments.apply_event"
    assert keys.namespaced("payments.apply_event.v1", "payment-event:evt_1") == (
        "payments.apply_event:payment-event:evt_1"
    )


def test_v1_and_v2_of_one_job_share_their_keys_and_other_tasks_do_not() -> None:
    v1 = keys.namespaced("email.send_receipt.v1", "receipt:ord_1")
    assert v1 == keys.namespaced("email.send_receipt.v2", "receipt:ord_1")
    assert v1 != keys.namespaced("email.send_reminder.v1", "receipt:ord_1")


def test_namespacing_twice_changes_nothing_and_bare_undoes_it() -> None:
    once = keys.namespaced("a.b.v1", "k:1")
    assert keys.namespaced("a.b.v2", once) == once
    assert keys.bare("a.b.v1", once) == "k:1"
    assert keys.bare("a.b.v1", "k:1") == "k:1"


@pytest.mark.parametrize("key", ["", "   ", "x" * (keys.MAX_KEY_LENGTH + 1)])
def test_an_empty_or_oversized_key_is_refused_naming_the_task(key: str) -> None:
    with pytest.raises(PayloadError, match=r"unit\.keyed\.v1") as refused:
        keys.checked("unit.keyed.v1", key)
    assert refused.value.fields == ["idempotency_key"]


def test_a_key_of_the_maximum_length_is_accepted() -> None:
    key = "x" * keys.MAX_KEY_LENGTH
    assert keys.checked("unit.keyed.v1", key) == key


@pytest.mark.parametrize(("note", "repeat"), [("", 1), ("y" * 100, 100)])
def test_a_call_whose_key_renders_empty_or_10_kb_raises_before_any_publish(
    note: str, repeat: int
) -> None:
    # prepare is the publish path's first step: it raises before the store or broker
    with pytest.raises(PayloadError, match="idempotency key"):
        keyed.prepare({"call_id": "c1", "note": note, "repeat": repeat}, {})


def test_the_store_key_is_namespaced_and_the_header_keeps_the_bare_key() -> None:
    _, key, headers = fixed.prepare({"call_id": "c1"}, {})
    assert key == "unit.fixed:fixed:c1"
    assert headers["cc_idempotency_key"] == "fixed:c1"


def test_an_explicit_key_is_refused_for_a_task_that_does_not_allow_overrides() -> None:
    with pytest.raises(ConfigurationError, match="key_override=True"):
        fixed.prepare({"call_id": "c1"}, {"idempotency_key": "other"})


def test_an_explicit_key_equal_to_the_declared_one_is_accepted_bare_or_namespaced() -> None:
    for given in ("fixed:c1", "unit.fixed:fixed:c1"):
        _, key, _ = fixed.prepare({"call_id": "c1"}, {"idempotency_key": given})
        assert key == "unit.fixed:fixed:c1"


def test_the_worker_ignores_a_header_key_for_a_task_whose_key_it_can_compute() -> None:
    payload = Call(call_id="c1")
    assert fixed.run_key(payload, {"cc_idempotency_key": "forged"}) == (
        "unit.fixed:fixed:c1", "fixed:c1",
    )  # fmt: skip
