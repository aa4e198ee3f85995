"""The e-mail provider's client, as the shop uses it (a stand-in for a real SDK).

Like most providers it takes an idempotency key: a second send with the same key is
accepted and sends nothing. ``outage(n)`` and ``unknown`` let a test make it fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class Unavailable(Exception):
    """The provider did not answer (a 503): trying again later can help."""


class MailboxUnknown(Exception):
    """The provider refused the address for good: trying again cannot help."""


@dataclass
class Mailer:
    #: idempotency key -> (recipient, template), one entry per e-mail really sent
    sent: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: recipients the provider refuses
    unknown: set[str] = field(default_factory=set)
    _outages: int = 0

    def outage(self, calls: int) -> None:
        """The next ``calls`` sends fail with ``Unavailable``."""
        self._outages = calls

    def send(self, to: str, template: str, *, idempotency_key: str) -> None:
        if self._outages > 0:
            self._outages -= 1
            raise Unavailable("503 Service Unavailable")
        if to in self.unknown:
            raise MailboxUnknown(f"550 no such mailbox: {to}")
        self.sent.setdefault(idempotency_key, (to, template))

    def reset(self) -> None:
        self.sent.clear()
        self.unknown.clear()
        self._outages = 0


mailer = Mailer()
