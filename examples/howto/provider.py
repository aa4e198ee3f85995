"""Stands for your own code in the how-tos: an order lookup and a payment provider.

The provider honours idempotency keys the way Stripe's ``Idempotency-Key`` header does:
a second request with the same key returns the first answer and charges nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Order:
    id: str
    amount_minor: int


def load_order(order_id: str) -> Order:
    """Read the order now, at run time (the payload carries its id only)."""
    return Order(order_id, amount_minor=1250)


@dataclass
class Provider:
    """A payment API: one charge per idempotency key, however often it is asked."""

    charges: dict[str, Order] = field(default_factory=dict)

    def charge(self, order: Order, *, idempotency_key: str) -> str:
        self.charges.setdefault(idempotency_key, order)
        return f"ch_{idempotency_key}"


provider = Provider()
