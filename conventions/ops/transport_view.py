"""What the layer's Redis transport holds beside the queues, read for operators.

The queues view (:mod:`conventions.observability.queues`) sits below the transport and
does not import it; this module gives it a :data:`~conventions.observability.queues.
Holdings` reader built on :mod:`conventions.transport.layout`'s readers: per queue, the
delayed set (and its next due time), the messages in flight and in inboxes, and the
consumers alive. ``conventions queues``, the exporter and the doctor's live checks read
the broker through :func:`broker_reader`.
"""

from __future__ import annotations

from typing import Any

from conventions.observability import queues
from conventions.ops.doctor_time import layer_transport
from conventions.transport import layout


def transport_holdings(unacked_key: str = "unacked") -> queues.Holdings:
    """What the layer's Redis transport holds of each queue beside its lists, read with
    :mod:`conventions.transport.layout`'s readers: a few commands per queue, per consumer
    and per inbox, whatever the depths. The next due time is compared with the Redis
    server's clock, the one the movers decide on (never this machine's)."""

    def read(client: Any, names: Any) -> tuple[dict[str, queues.Held], float]:
        clock = layout.server_now(client)
        alive = layout.consumers_alive(client)
        skews = layout.clock_skews(client)
        inboxes = layout.in_inboxes_by_queue(client)
        in_flight = layout.in_flight_by_queue(client, unacked_key)
        held = {}
        for name in names:
            delayed = layout.delayed(client, name)
            held[name] = queues.Held(
                delayed.count, delayed.next_due, in_flight.get(name, 0),
                inboxes.get(name, 0), alive.get(name, 0), skews.get(name),
            )  # fmt: skip
        return held, clock

    return read


def broker_reader(app: Any, client: Any = None) -> queues.Reader:
    """The queues reader of the app's broker, with the transport's holdings when the app
    runs the layer's Redis transport (kombu's stock one keeps none: they read as None)."""
    holdings = None
    if layer_transport(app.conf):
        options = app.conf.broker_transport_options or {}
        holdings = transport_holdings(str(options.get("unacked_key") or "unacked"))
    return queues.from_app(app, client=client, holdings=holdings)
