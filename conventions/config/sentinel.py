"""Redis Sentinel broker URLs (``sentinel://host:port;sentinel://...``): how they are
recognised, and what the layer says about them.

The layer's Redis transport reads one Redis primary; on a Sentinel URL it is refused in
one line (:func:`refusal`) until it follows a failover. kombu's stock Redis transport
runs on Sentinel (``broker_transport_options={'master_name': ...}``) and gives up what
:data:`STOCK` says. This module imports nothing of the layer's: the profile and the
doctor both ask it.
"""

from __future__ import annotations

from typing import Any

#: the URL schemes of a Sentinel broker
SCHEMES = ("sentinel://", "sentinels://")

#: what a Sentinel broker gives up on kombu's stock transport, and how to get it
STOCK = (
    "kombu's stock Redis transport with broker_transport_options={'master_name': "
    "'<master>'} runs on Sentinel, without the layer's inbox fetch (a worker killed "
    "mid-fetch may lose that message) and without its delayed set (workers hold retry "
    "ETAs unacked, so countdowns must stay below the visibility timeout)"
)


def is_sentinel(url: Any) -> bool:
    """Is ``url`` (or one of a ``;``-separated list) a Redis Sentinel one?"""
    return isinstance(url, str) and any(part.strip().startswith(SCHEMES) for part in url.split(";"))


def refusal(url: Any, *, layer_transport: bool, transport: str) -> str | None:
    """Why a Sentinel ``url`` cannot run on the layer's transport (named ``transport``),
    or None: not a Sentinel URL, or the layer's transport is not asked for
    (``layer_transport`` False: kombu's stock one runs it)."""
    if not is_sentinel(url) or not layer_transport:
        return None
    return (
        f"broker_url sentinel:// is not supported by the layer's Redis transport yet "
        f"({transport} reads one Redis primary); {STOCK}"
    )
