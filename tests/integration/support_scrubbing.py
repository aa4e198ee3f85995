"""Test-only jobs whose exceptions carry an e-mail address (``tests/integration/test_scrubbing``).

Imported by the tests and by subprocess workers through ``--include``.
"""

from __future__ import annotations

import smtplib

from conventions import Id, JobContext, Payload, PermanentError
from tasks import app

#: the address every job here puts into its exception: it must never leave the worker raw
ADDRESS = "someone@example.com"


class Mail(Payload):
    call_id: Id


def refused() -> smtplib.SMTPRecipientsRefused:
    """What ``smtplib`` raises for a 550 at RCPT TO: the address is the dict's key."""
    return smtplib.SMTPRecipientsRefused(
        {ADDRESS: (550, f"5.1.1 <{ADDRESS}>: mailbox unavailable".encode())}
    )


@app.job("testing.refused_mail.v1", payload=Mail, key="refused:{call_id}", workload="email")
def refused_mail(payload: Mail, ctx: JobContext) -> None:
    recipient = ADDRESS  # a frame local that holds the address
    raise refused() if recipient else PermanentError()


@app.job("testing.refused_wrapped.v1", payload=Mail, key="wrapped:{call_id}", workload="email")
def refused_wrapped(payload: Mail, ctx: JobContext) -> None:
    try:
        raise refused()
    except smtplib.SMTPRecipientsRefused as exc:
        raise PermanentError(f"the provider refused {ADDRESS}") from exc
