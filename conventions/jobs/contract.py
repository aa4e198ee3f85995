"""A job's contract: what a publisher needs to know of it, without its body.

A web process that publishes a job should not import the job's body, nor what the body
imports (the ORM models, the mail client, a provider SDK). The contract is the part both
sides share: the versioned name, the payload model, the idempotency key template and the
workload (its queue), with the publish options that change what ``.delay()`` does
(``dedup``, ``key_override``, ``overflow``). Keep contracts in a module of their own that
imports nothing but the layer and pydantic::

    # myshop/contracts.py: imported by the web process and by the worker
    class SendReceipt(Payload):
        order_id: Id

    SEND_RECEIPT = Contract(
        "email.send_receipt.v2", payload=SendReceipt, key="receipt:{order_id}",
        workload="email",
    )

The worker declares the body against it, with the options only a worker uses
(``@app.job(SEND_RECEIPT, backoff=...)``); the web process gets a publisher of it
(``app.publisher(SEND_RECEIPT)``), whose ``.delay()`` validates the payload, derives the
key, deduplicates and sets the headers exactly as the job's own ``.delay()`` does. A
publisher's body never runs: a worker that has the contract but no body for it
dead-letters the job as a bug, saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conventions.jobs.payloads import Payload

#: a key template over payload fields, or a callable of the payload
KeyTemplate = str | Callable[[Any], str]


@dataclass(frozen=True)
class Contract:
    """The publish-side declaration of a job (checked when an app uses it)."""

    #: ``domain.action.vN``
    name: str
    #: the pydantic payload model
    payload: type[Payload]
    #: the idempotency key template over payload fields, or a callable of the payload
    key: KeyTemplate
    #: the workload the routing maps to a queue
    workload: str
    #: enqueue dedup window: "until_done", "forever", a TTL in seconds, or None (off)
    dedup: str | float | None = "until_done"
    #: may a call give another key than the one ``key`` derives (``idempotency_key=``)?
    key_override: bool = False
    #: past a backpressure bound: "raise" QueueOverCapacity, or "shed" the job
    overflow: str = "raise"
