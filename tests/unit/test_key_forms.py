"""An idempotency key in either form: bare (as the body and the run history hold it) or
under its task's namespace (as the store and dead letters keep it)."""

from __future__ import annotations

from conventions.store import key_forms

TASKS = ["billing.charge_invoice.v1", "billing.charge_invoice.v2", "email.send_receipt.v1"]


def test_either_form_matches_a_key_kept_in_either_form() -> None:
    task = "billing.charge_invoice.v1"
    for stored in ("charge:inv_4004", "billing.charge_invoice:charge:inv_4004"):
        for query in ("charge:inv_4004", "billing.charge_invoice:charge:inv_4004"):
            assert key_forms.same_key(task, stored, query)


def test_another_tasks_namespace_or_another_key_does_not_match() -> None:
    task = "billing.charge_invoice.v1"
    assert not key_forms.same_key(task, "charge:inv_4004", "email.send_receipt:charge:inv_4004")
    assert not key_forms.same_key(task, "charge:inv_4004", "charge:inv_4005")
    assert not key_forms.same_key(task, None, "charge:inv_4004")


def test_a_bare_key_is_looked_for_as_typed_and_under_each_namespace_once() -> None:
    assert key_forms.store_forms("charge:inv_4004", TASKS) == [
        "charge:inv_4004",
        "billing.charge_invoice:charge:inv_4004",
        "email.send_receipt:charge:inv_4004",
    ]
    namespaced = "billing.charge_invoice:charge:inv_4004"
    assert key_forms.store_forms(namespaced, TASKS) == [namespaced]


def test_a_namespaced_key_is_also_looked_for_bare() -> None:
    assert key_forms.bare_forms("billing.charge_invoice:charge:inv_4004", TASKS) == [
        "billing.charge_invoice:charge:inv_4004",
        "charge:inv_4004",
    ]
    assert key_forms.bare_forms("charge:inv_4004", TASKS) == ["charge:inv_4004"]


def test_both_forms_are_given_for_display() -> None:
    task = "billing.charge_invoice.v2"
    expected = ("charge:inv_4004", "billing.charge_invoice:charge:inv_4004")
    assert key_forms.both(task, "charge:inv_4004") == expected
    assert key_forms.both(task, "billing.charge_invoice:charge:inv_4004") == expected
    assert key_forms.both(task, None) == ("-", "-")
