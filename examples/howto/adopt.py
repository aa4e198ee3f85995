"""Adopting the layer (docs/howto/adopt.md): install, apply the profile, declare jobs.

The module a project makes its app in (its ``tasks/__init__.py``), after
``pip install celery-conventions``. ``send_welcome_email`` is the project's old plain
Celery task, kept under its old name: its body forwards to the convention job, so
messages queued before the deploy, and callers not moved yet, take the new path.
"""

from __future__ import annotations

import os

from conventions import App, Id, JobContext, Payload
from conventions.config.profile import reliable

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
WORKLOADS = {"email": "celery"}  # workload -> a queue your workers already consume

# (set_as_current=False: only because the how-to examples share one process)
app = App("myproject", set_as_current=False)  # was: Celery("myproject")
app.conf.update(
    reliable(
        broker_url=REDIS_URL,
        store_url=os.environ.get("CONVENTIONS_STORE_URL", REDIS_URL),
    ),
    conventions_workloads=WORKLOADS,  # the app declares their queues and routes
)


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
