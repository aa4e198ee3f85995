"""Classify your own exceptions (docs/howto/retries-and-errors.md)."""

from __future__ import annotations

from conventions import Id, JobContext, Payload
from conventions.jobs.decisions import DEFAULT_TABLE, DeadLetterDecision, RetryDecision, named, when
from conventions.store.records import Category
from examples.howto.app import app


class RateLimited(Exception):
    """The provider asks us to slow down."""


class AccountClosed(Exception):
    """The customer's account is closed: trying again cannot help."""


class AlreadyRefunded(Exception):
    """Someone refunded it by hand: nothing to do."""


class Throttled(Exception):
    """The provider throttles us for a minute."""


class FraudSuspected(Exception):
    """The fraud check stopped it: a person must look."""


class Refund(Payload):
    refund_id: Id


@app.job(
    "payments.refund.v1",
    payload=Refund,
    key="refund:{refund_id}",
    workload="email",
    errors={
        RateLimited: "transient",  # retried with the task's backoff
        AccountClosed: "permanent",  # dead letter, category permanent
        AlreadyRefunded: "skip",  # ends as skipped
        Throttled: RetryDecision("provider throttled", delay=60),  # a decision value
        FraudSuspected: DeadLetterDecision(Category.PERMANENT, "fraud check", alert=True),
    },
)
def refund(payload: Refund, ctx: JobContext) -> str:
    return f"refunded {payload.refund_id}"


TABLE = DEFAULT_TABLE.extend(
    when(
        named("stripe.error.RateLimitError"),
        RetryDecision("stripe rate limit", delay=30),
        name="stripe rate limit",
    ),
    when(
        lambda exc: getattr(exc, "code", None) == "lock_timeout",
        RetryDecision("db lock timeout"),
        name="db lock timeout",
    ),
)


@app.job(
    "payments.capture.v1", payload=Refund, key="capture:{refund_id}", workload="email", errors=TABLE
)
def capture(payload: Refund, ctx: JobContext) -> str:
    return f"captured {payload.refund_id}"
