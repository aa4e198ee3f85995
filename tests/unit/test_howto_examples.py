"""The how-to examples (``examples/howto/``) import, declare what the pages say, and run.

Bodies run the way the write-a-task page tells a unit test to: ``task.run(payload, ctx)``.
``tests/integration/test_howto_examples.py`` runs them through a real worker.
"""

from __future__ import annotations

import datetime as dt

import pytest

from conventions import ConfigurationError, JobContext, PayloadError
from conventions.jobs.decisions import DeadLetterDecision, RetryDecision, SkipDecision
from conventions.store.records import Category
from conventions.task import ConventionTask
from conventions.tracing.context import Trace
from examples.howto import adopt, charge_order, errors, payloads, schedule_config, v2
from examples.howto.app import app
from examples.howto.provider import provider


def context_for(task: ConventionTask, key: str) -> JobContext:
    return JobContext(task.name, "t-1", key, 1, Trace("corr-1"))


def test_the_complete_task_charges_the_provider_once_per_idempotency_key() -> None:
    task = charge_order.charge_order
    payload = task.payload(order_id="ord_0001")
    ctx = context_for(task, "charge:ord_0001")
    assert task.run(payload, ctx) == "charged"
    assert task.run(payload, ctx) == "charged"  # a retry: same key, no second charge
    assert list(provider.charges) == ["charge:ord_0001"]
    assert isinstance(task.decisions.decide(charge_order.RateLimited()), RetryDecision)
    assert task.replayable is False


def test_the_errors_mapping_gives_each_exception_its_decision() -> None:
    decide = errors.refund.decisions.decide
    assert isinstance(decide(errors.RateLimited()), RetryDecision)
    assert decide(errors.AccountClosed()) == DeadLetterDecision(
        Category.PERMANENT, decide(errors.AccountClosed()).reason
    )
    assert isinstance(decide(errors.AlreadyRefunded()), SkipDecision)
    assert decide(errors.Throttled()) == RetryDecision("provider throttled", delay=60)
    assert decide(errors.FraudSuspected()) == DeadLetterDecision(
        Category.PERMANENT, "fraud check", True
    )
    assert isinstance(decide(ValueError("unknown")), DeadLetterDecision)  # a bug, as always


def test_the_extended_table_matches_by_name_and_by_predicate_and_keeps_the_defaults() -> None:
    class RateLimitError(Exception):
        pass

    RateLimitError.__module__, RateLimitError.__qualname__ = "stripe.error", "RateLimitError"
    lock = Exception("lock")
    lock.code = "lock_timeout"  # type: ignore[attr-defined]
    decide = errors.capture.decisions.decide
    assert decide(RateLimitError()) == RetryDecision("stripe rate limit", delay=30)
    assert decide(lock) == RetryDecision("db lock timeout")
    assert isinstance(decide(TimeoutError()), RetryDecision)  # from DEFAULT_TABLE
    assert "stripe rate limit" in errors.TABLE.names


def test_the_statement_payload_validates_and_refuses_an_extra_field() -> None:
    statement = payloads.SendStatement(customer_id="cus_1", period_end=dt.date(2026, 11, 30))
    assert statement.layout is payloads.Layout.BASIC
    with pytest.raises(ValueError):
        payloads.SendStatement(customer_id="cus_1", period_end="2026-11-30", email="a@b.c")


def test_the_v1_upcaster_runs_v1_payloads_as_v2_under_the_same_key() -> None:
    old = v2.SendInvoiceV1(order_id="ord_7")
    converted = v2.send_invoice_v1.upcast(old)
    assert v2.send_invoice_v1.upcast_into is v2.send_invoice
    assert converted == v2.SendInvoice(order_id="ord_7", layout="basic")
    body = v2.send_invoice.run(converted, context_for(v2.send_invoice, "invoice:ord_7"))
    assert body == "sent the basic invoice of ord_7"
    assert "email.send_invoice.v1" in app.tasks and "email.send_invoice.v2" in app.tasks


def test_the_schedule_entries_have_occurrences_and_the_watchdog() -> None:
    names = [entry.name for entry in schedule_config.SCHEDULE]
    assert names == ["daily-sales", "sync-stock", "watchdog"]
    now = dt.datetime(2026, 11, 30, 21, 0, tzinfo=dt.UTC)  # 04:00 on Dec 1 in Bangkok
    daily = schedule_config.SCHEDULE[0]
    upcoming = daily.occurrence(daily.schedule.next_after(now))
    assert upcoming.label == "2026-12-02"
    assert daily.payload_for(upcoming) == {"business_date": dt.date(2026, 12, 1)}


def test_the_adopted_task_keeps_its_old_plain_name_beside_the_convention_task() -> None:
    assert not isinstance(adopt.send_welcome_email, ConventionTask)
    assert isinstance(adopt.send_welcome, ConventionTask)
    assert adopt.send_welcome.name == "accounts.send_welcome.v1"
    with pytest.raises(PayloadError):
        adopt.send_welcome.delay("usr_1")  # keyword arguments only, refused before publishing


def test_the_examples_app_refuses_a_bad_declaration_at_definition_time() -> None:
    with pytest.raises(ConfigurationError):
        app.job("SendReceipt", payload=v2.SendInvoice, key="r:{order_id}", workload="email")


def test_a_contract_gives_the_web_process_a_publisher_and_the_worker_its_body() -> None:
    from examples.howto import contracts, invoices, publishing

    publisher, body = publishing.send_invoice, invoices.send_invoice
    assert publisher.name == body.name == contracts.SEND_INVOICE.name
    assert publisher.payload is body.payload is contracts.SendInvoice
    assert getattr(publisher, "publisher_only", False)
    with pytest.raises(PayloadError, match="invoice_id"):
        publisher.delay(invoice_id="not an id!")
    ctx = context_for(body, "invoice:inv_1")
    assert body.run(body.payload(invoice_id="inv_1"), ctx) == "sent inv_1 once, under invoice:inv_1"
