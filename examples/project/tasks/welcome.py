"""One convention job: a welcome message per new account, sent once."""

from __future__ import annotations

from conventions import Id, JobContext, Payload
from tasks import app


class Welcome(Payload):
    """An id-only payload: the job looks the account up, the message carries no data."""

    account_id: Id


@app.job(
    "accounts.send_welcome.v1",
    payload=Welcome,
    key="welcome:{account_id}",  # one welcome per account: the same key is the same effect
    workload="default",
    dedup="forever",  # a second .delay() for the account returns the first job's handle
)
def send_welcome(payload: Welcome, ctx: JobContext) -> str:
    return f"welcome sent to {payload.account_id} (key {ctx.idempotency_key})"
