"""Adopting the layer one task at a time (docs/howto/adopt.md).

``send_welcome_email`` is the project's old plain Celery task. Its body now forwards to
the convention task, so messages queued before the deploy, and callers not moved yet,
take the new path: validation, a key, dedup, retries by decision, dead letters.
"""

from __future__ import annotations

from conventions import Id, JobContext, Payload
from examples.howto.app import app


class WelcomeEmail(Payload):
    """Which user to welcome."""

    user_id: Id


@app.job(
    "accounts.send_welcome.v1", payload=WelcomeEmail, key="welcome:{user_id}", workload="email"
)
def send_welcome(payload: WelcomeEmail, ctx: JobContext) -> str:
    return f"welcomed {payload.user_id}"


@app.task(name="accounts.tasks.send_welcome_email")  # the old name, unchanged
def send_welcome_email(user_id: int) -> str:
    """The old task, kept as a forwarder until its queue has drained."""
    return str(send_welcome.delay(user_id=f"usr_{user_id}").id)
